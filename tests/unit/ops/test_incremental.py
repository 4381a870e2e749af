"""The incremental ledger's diff (pipeline/ops/incremental.py): which input files are new, unchanged, touched, changed
or removed (the whole `pileprep shard --incremental` runs: tests/integration/ops/test_incremental.py).
"""
from __future__ import annotations

from model_contract.manifest_rows import LedgerRow
from pipeline.ops import incremental


# ------------------------------------------------------------------------------------------- pure logic
def _row(path, size=10, mtime=1.0, **kw):
    return {"path": path, "bytes": size, "mtime": mtime, **kw}


def _held(path, generation="g1", size=10, mtime=1.0, **kw):
    return LedgerRow(path, size, generation, mtime, **kw)


def test_diff_ledger_classifies_new_unchanged_touched_changed_removed():
    ledger = [_held("a", sha256="A"), _held("b", sha256="B"), _held("c", sha256="C"),
              _held("d", "g2", sha256="D"), _held("e", "g0")]
    current = [_row("a"), _row("b", mtime=2.0), _row("c", mtime=2.0), _row("d", size=11), _row("e", mtime=9.0),
               _row("f")]
    hashes = {"b": "B", "c": "C-edited"}
    diff = incremental.diff_ledger(ledger, current, hasher=lambda p: (10, hashes[p]))
    assert [r["path"] for r in diff.new] == ["f"]
    assert sorted(r["path"] for r in diff.unchanged) == ["a", "b", "e"]  # e: legacy row, size only
    assert [r["path"] for r in diff.touched] == ["b"]
    assert sorted(c["path"] for _o, c in diff.changed) == ["c", "d"]
    problems = "\n".join(diff.problems())
    assert "c (same size, different content" in problems and "d (size 10 -> 11)" in problems
    assert diff.removed == [] and "1 new, 3 already held, 2 changed, 0 removed" == diff.summary()
    gone = incremental.diff_ledger(ledger, current[:1], hasher=lambda p: (10, "?"))
    assert [r.path for r in gone.removed] == ["b", "c", "d", "e"]


def test_etag_decides_for_object_stores():
    old = [_held("s3://b/k", etag="e1", sha256="S")]
    same = incremental.diff_ledger(old, [_row("s3://b/k", etag="e1", mtime=5.0)], hasher=None)
    assert [r["path"] for r in same.unchanged] == ["s3://b/k"]  # re-uploaded, same ETag: unchanged, no hash


# ------------------------------------------------------------------------------------------- compatibility
def test_a_setting_absent_at_its_default_is_named_by_its_value_not_none():
    """to_manifest_dict leaves a setting out at its default (generation names stay), so the committed dataset's
    `near_dedup_shingles: tokens` against a run at the default used to read "committed 'tokens', this run None"
    (issue 29); the message names the default the absence stands for, on either side."""
    import types

    import pytest

    from pipeline.config import ShardConfig

    base = dict(inputs=("x.jsonl",), output="out", tokenizer="t.model", near_dedup=True)
    words, tokens = (ShardConfig(**base).to_manifest_dict(),
                     ShardConfig(**base, near_dedup_shingles="tokens").to_manifest_dict())
    committed = types.SimpleNamespace(contract=types.SimpleNamespace(to_dict=dict), config=tokens)
    with pytest.raises(incremental.IncompatibleGenerationError) as e:
        incremental.check_compatible(committed, {}, words)
    assert "config.near_dedup_shingles: committed 'tokens', this run 'words' (the default)" in str(e.value)
    assert "None" not in str(e.value)
    committed.config = words
    with pytest.raises(incremental.IncompatibleGenerationError, match=r"committed 'words' \(the default\), "
                                                                      r"this run 'tokens'"):
        incremental.check_compatible(committed, {}, tokens)
