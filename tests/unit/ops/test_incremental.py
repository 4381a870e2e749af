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
