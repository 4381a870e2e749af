"""pipeline/shard/split_inputs.py: which split each input file feeds (--input by hash, --val-input and
--test-input whole), a file claimed by two flags refused, and the warning for a train file named like val/test."""
from __future__ import annotations

import pytest

from pipeline.config import ShardConfig
from pipeline.errors import ConfigError
from pipeline.shard import split_inputs
from transforms.shard.documents import HASHED, SPLITS


def _files(tmp_path, *names):
    for n in names:
        (tmp_path / n).write_text('{"text": "x"}\n')
    return [str(tmp_path / n) for n in names]


def test_each_file_is_tagged_with_its_split_and_the_ledger_is_sorted(tmp_path):
    b, a, v, t = _files(tmp_path, "b.jsonl", "a.jsonl", "v.jsonl", "t.jsonl")
    config = ShardConfig(inputs=(str(tmp_path / "[ab].jsonl"),), output="o", tokenizer="t", val_inputs=(v,),
                         test_inputs=(t,))
    rows, split_of = split_inputs.list_inputs_with_splits(config)
    assert [r["path"] for r in rows] == sorted([a, b, v, t])
    assert split_of == {a: HASHED, b: HASHED, v: SPLITS.index("val"), t: SPLITS.index("test")}
    ledger = [type("Row", (), {"path": p})() for p in (t, a)]
    assert split_inputs.input_splits_for(ledger, split_of) == (SPLITS.index("test"), HASHED)


def test_a_file_claimed_by_two_flags_is_refused_naming_both(tmp_path):
    (v,) = _files(tmp_path, "v.jsonl")
    config = ShardConfig(inputs=(str(tmp_path / "*.jsonl"),), output="o", tokenizer="t", val_inputs=(v,))
    with pytest.raises(ConfigError, match=r"v\.jsonl is matched by both --input and --val-input"):
        split_inputs.list_inputs_with_splits(config)


def test_a_train_file_named_like_a_held_out_one_is_warned_about():
    warnings = split_inputs.held_out_name_warnings({"/d/val.jsonl.zst": HASHED, "/d/00.jsonl.zst": HASHED,
                                                    "/d/test.jsonl": SPLITS.index("test")})
    assert len(warnings) == 1 and warnings[0].startswith("--input /d/val.jsonl.zst:"), warnings
