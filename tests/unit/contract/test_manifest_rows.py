"""model_contract/manifest_rows.py on its own: each row record checks its JSON naming the field path and writes the
same JSON back (whole manifests: tests/unit/contract/test_manifest.py, test_manifest_check.py)."""
from __future__ import annotations

import pytest

from model_contract import ContractError
from model_contract.manifest_rows import RecordCounts, ShardInfo, SkippedInput, section_json

SHARD = {"path": "gen-" + "a" * 16 + "/train-00000-of-00001.tfrecord", "split": "train", "examples": 3,
         "tokens": 20, "padding_tokens": 4, "documents": 2, "bytes": 100, "sha256": "cd" * 32}


def test_a_shard_row_round_trips_its_json():
    row = ShardInfo.from_dict(dict(SHARD))
    assert row.examples == 3 and row.to_dict() == SHARD


@pytest.mark.parametrize("field,value", [("tokens", -1), ("bytes", "100"), ("sha256", "cd"),
                                         ("path", "../elsewhere.tfrecord"), ("path", "/abs.tfrecord")])
def test_a_damaged_shard_row_is_refused_naming_the_field(field, value):
    with pytest.raises(ContractError, match=f"shards\\[0\\].{field}"):
        ShardInfo.from_dict(dict(SHARD, **{field: value}), "shards[0]")


def test_record_counts_default_to_zero_and_write_every_field_back():
    counts = RecordCounts.from_dict({"read": 5, "filtered": {"empty_text": 1}})
    assert counts == RecordCounts(5, 0, {"empty_text": 1}, {})
    assert counts.to_dict() == {"read": 5, "written": 0, "filtered": {"empty_text": 1}, "dead_lettered": {}}
    with pytest.raises(ContractError, match="records.filtered"):
        RecordCounts.from_dict({"filtered": {"empty_text": -2}})


def test_section_json_writes_records_lists_of_records_and_plain_values():
    skipped = SkippedInput("in/a.jsonl", "empty")
    assert section_json(skipped) == {"path": "in/a.jsonl", "reason": "empty"}
    assert section_json([skipped, skipped]) == [skipped.to_dict()] * 2
    assert section_json({"a": 1}) == {"a": 1} and section_json("shard") == "shard"
