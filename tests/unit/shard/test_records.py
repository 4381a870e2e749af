"""transforms/shard/records.py: the typed records the shard job's stages
hand the commit, and that they write the manifest's JSON exactly as the dicts did."""
from __future__ import annotations

import pytest

from model_contract import DataContract, Manifest, TokenizerInfo
from model_contract.manifest_rows import LedgerRow, RecordCounts
from pipeline.ops.incremental import InputsChangedError
from pipeline.shard import integrity
from transforms.shard.records import CommitParts, InputFile, CutOutput
from transforms.shard import records

GEN = "gen-" + "b" * 16
SHA = "ef" * 32


def test_file_stats_count_merge_and_write_the_manifest_form():
    a = records.FileStats(read=5)
    a.dead_letter("invalid_json")
    a.filter("too_short", 2)
    b = records.FileStats(read=2, written=2)
    b.filter("duplicate")
    b.filter("too_short")
    total = records.FileStats().merge(a).merge(b)
    assert (total.read, total.written, total.settled()) == (7, 2, 7)
    assert total.to_dict() == {"read": 7, "written": 2, "filtered": {"duplicate": 1, "too_short": 3},
                               "dead_lettered": {"invalid_json": 1}}
    assert list(total.to_dict()["filtered"]) == ["duplicate", "too_short"]  # sorted, as the manifest writes
    assert RecordCounts.from_dict(total.to_dict()).to_dict() == total.to_dict()
    assert records.FileStats.from_dict(total.to_dict()) == total


def test_commit_parts_are_told_apart_by_type():
    split = CutOutput(records.CutResult(0, "a.jsonl", [], records.FileStats(), None), InputFile("a.jsonl", 4))
    unit = records.UnitResult.__new__(records.UnitResult)
    shard = records.ShardResult.__new__(records.ShardResult)
    parts = CommitParts.gather([shard, split, unit, split])
    assert parts.cuts == [split, split] and parts.units == [unit] and parts.shards == [shard]
    with pytest.raises(TypeError, match="not a stage result"):
        CommitParts.gather([("split", split)])  # the old string-tagged form is refused, not misfiled


def test_input_file_is_the_listing_row_and_the_ledger_row_adds_generation_and_sha256():
    row = {"path": "in/a.jsonl", "bytes": 10, "mtime": 0.0}
    assert InputFile.from_dict(row).to_dict() == row
    m = Manifest(contract=DataContract.for_tokens(8, TokenizerInfo("sentencepiece", SHA, 100, 2, 3, 0, 1)),
                 shards=[])
    m.ledger = integrity.ledger_rows(GEN, [row, {"path": "in/b.jsonl", "bytes": 5, "mtime": 2.0, "etag": "e"}],
                                     {"in/a.jsonl": InputFile("in/a.jsonl", 10, sha256=SHA)})
    assert [r.to_dict() for r in m.ledger] == [dict(row, generation=GEN, sha256=SHA),
                                               {"path": "in/b.jsonl", "bytes": 5, "mtime": 2.0, "etag": "e",
                                                "generation": GEN}]
    assert [LedgerRow.from_dict(r.to_dict()) for r in m.ledger] == m.ledger
    with pytest.raises(InputsChangedError, match="listed with 10 bytes but 11 bytes were read"):
        integrity.ledger_rows(GEN, [row], {"in/a.jsonl": InputFile("in/a.jsonl", 11, sha256=SHA)})
