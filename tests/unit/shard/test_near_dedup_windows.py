"""Bounded key windows of the files shuffle (pipeline/shard/near_dedup/windows.py RangeWindows, band_files.py
WINDOW_ROWS): a key-range task holds at most WINDOW_ROWS band rows at once and writes the bytes (edges, band
index) of the whole range at once. The end-to-end byte check (shards, manifest, sidecars) is in
tests/e2e/test_near_dedup_pipeline.py and tests/e2e/test_near_dedup_incremental.py."""
from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

from pipeline.errors import RunError
from pipeline.shard.near_dedup import band_files, band_index_writer, windows
from pipeline.shard.near_dedup import edges as near_edges
from pipeline.shard.near_dedup.elements import CommittedBandFile, DocRef, IndexTask, RangeTask
from pipeline.shard.near_dedup.settings import NearDedupConfig
from transforms.io import io_utils
from transforms.shard import doc_ids
from transforms.shard.near_dedup import band_index, minhash, paths

PARAMS = minhash.MinHashParams()
CAP = 40


def make_plan(tmp_path):
    config = types.SimpleNamespace(near_dedup_config=NearDedupConfig(True, PARAMS.bands, PARAMS.rows, 0.8,
                                                                     shingles=PARAMS.shingles, seed=0))
    return types.SimpleNamespace(config=config, staging_dir=str(tmp_path / "staging"), data_dir=str(tmp_path / "d"))


def stage_units(plan, n_units: int = 3, n_docs: int = 120) -> list:
    """Units of random signatures; every unit after the first also holds copies (same signature, other id,
    split) of 10 of the first unit's documents, so their band keys meet in buckets across units, and exact
    copies (same id) of 4 more."""
    rng = np.random.default_rng(7)
    base = rng.integers(0, 1 << 32, size=(n_docs, PARAMS.num_perm), dtype=np.uint64).astype(np.uint32)
    names = []
    for u in range(n_units):
        sigs = rng.integers(0, 1 << 32, size=(n_docs, PARAMS.num_perm), dtype=np.uint64).astype(np.uint32)
        if u:
            sigs[:10] = base[:10]
        else:
            sigs = base
        docs = [DocRef(u * 1_000_000 + i * 7 + 1, int(i % 3 == 0), f"src{u}", (f"unit-{u}", i)) for i in range(n_docs)]
        if u:  # exact copies of unit 0's documents 10..13 (same id and text), in another split in unit 2, and
            sigs[10:14] = sigs[14:18] = base[10:14]  # near-copies of them (other ids), so that they have edges
            docs[10:14] = [DocRef(i * 7 + 1, int(u == 2 and i % 2 == 0), f"src{u}", (f"unit-{u}", i))
                           for i in range(10, 14)]
        keys = minhash.band_keys(sigs, PARAMS) >> np.uint64(1)
        name = f"unit-{u}"
        band_files.write_band_files(plan.staging_dir, name, docs, sigs, keys)
        names.append(name)
    return names


def range_rows(plan, r: int, unit_names) -> list:
    """[(unit name, staged band rows of key range r)] of every unit, in name order: the whole range at once, the
    reference the tasks' windows (windows.py RangeWindows) are checked against."""
    return [(name, np.frombuffer(io_utils.read_bytes(paths.band_rows(plan.staging_dir, name, r)),
                                 dtype=band_files.BAND_ROW))
            for name in sorted(unit_names)]


def one_window_index(plan, r: int, names, indexes) -> bytes:
    """The band index of range r as the task wrote it before windows: every unit's rows at once."""
    parts = [(name, a) for name, a in range_rows(plan, r, names) if a.size]
    rows = np.concatenate([a for _n, a in parts])
    tables = [band_files.unit_sigs(plan, name) for name, _a in parts]
    offsets = np.cumsum([0] + [t.shape[0] for t in tables[:-1]]).tolist()
    sig_rows = np.concatenate([a["doc"].astype(np.int64) + off for (_n, a), off in zip(parts, offsets)])
    removed = np.zeros(rows.size, dtype=bool)
    for _reason, path in indexes:
        removed |= doc_ids.IdIndex(path).contains(rows["doc_id"])
    kept = ~removed
    return band_index.encode_arrays(rows["key"][kept], rows["doc_id"][kept], rows["split"][kept],
                                    np.concatenate(tables), PARAMS.num_perm, sig_rows[kept])


@pytest.fixture
def counted(monkeypatch):
    """Rows held per window of every task run while the fixture is active."""
    seen = []
    original = windows.RangeWindows.windows

    def counting(self):
        for w, (parts, committed) in enumerate(original(self)):
            seen.append((sum(a.size for _n, a in parts) + len(committed), self.cuts[w + 1] - self.cuts[w]))
            yield parts, committed

    monkeypatch.setattr(windows.RangeWindows, "windows", counting)
    return seen


def test_a_task_holds_at_most_window_rows_and_writes_the_bytes_of_the_whole_range(tmp_path, monkeypatch, counted):
    plan = make_plan(tmp_path)
    names = stage_units(plan)
    removed = np.array(sorted({1_000_000 + 8, 2_000_000 + 1, 15}), dtype=doc_ids.ID_DTYPE)
    index_path = str(tmp_path / "removed.idx")
    doc_ids.write_index(index_path, iter([removed]), int(removed.size))
    indexes = (("near_duplicate", index_path),)
    monkeypatch.setattr(band_files, "WINDOW_ROWS", CAP)
    rows_of_range = []
    for r in range(band_index.BAND_RANGES):
        total = sum(a.size for _n, a in range_rows(plan, r, names))
        rows_of_range.append(total)
        counted.clear()
        edges = list(near_edges.range_edges(RangeTask(r, tuple(names)), plan))
        # many windows, none over the cap (a fine window alone may be: not at this size), every row once
        assert len(counted) >= total // CAP > 3
        assert all(rows <= CAP for rows, _fine in counted), counted
        assert sum(rows for rows, _f in counted) == total
        counted.clear()
        got = band_index_writer.write_band_index_range(IndexTask(r, tuple(names), indexes), plan)
        assert all(rows <= CAP for rows, _fine in counted)
        data = (tmp_path / "d" / paths.BAND_INDEX.format(r)).read_bytes()
        assert data == one_window_index(plan, r, names, indexes)
        assert got.bytes == len(data) and got.rows == len(data) // band_index.row_dtype(PARAMS.num_perm).itemsize
        # the same edges, in the same order, as one window holding the whole range
        monkeypatch.setattr(band_files, "WINDOW_ROWS", 1 << 40)
        counted.clear()
        whole = list(near_edges.range_edges(RangeTask(r, tuple(names)), plan))
        assert len(counted) == 1
        assert [(a.doc_id, b.doc_id, j) for a, b, j in edges] == [(a.doc_id, b.doc_id, j) for a, b, j in whole]
        assert edges
        monkeypatch.setattr(band_files, "WINDOW_ROWS", CAP)
    assert sum(rows_of_range) == 3 * 120 * PARAMS.bands


def test_committed_band_index_files_are_read_by_window_and_checked_whole(tmp_path, monkeypatch, counted):
    """Incremental: a committed range file is sha256-checked streaming, then read one window's slice at a time
    (binary search by ranged reads); its rows take part in the window's buckets as when read whole."""
    plan = make_plan(tmp_path)
    names = stage_units(plan)
    r = 3
    committed_path = tmp_path / "committed-r03.bin"
    data = one_window_index(plan, r, names[:1], ())
    committed_path.write_bytes(data)
    import hashlib  # noqa: PLC0415

    entry = CommittedBandFile("gen-0", "gen-0/near-dedup/band-index-r03.bin", r, len(data),
                              hashlib.sha256(data).hexdigest(), str(committed_path))
    monkeypatch.setattr(band_files, "WINDOW_ROWS", CAP)
    edges = list(near_edges.range_edges(RangeTask(r, tuple(names[1:])), plan, (entry,)))
    assert len(counted) > 3 and sum(n for n, _f in counted) == len(data) // band_index.row_dtype(
        PARAMS.num_perm).itemsize + sum(a.size for _n, a in range_rows(plan, r, names[1:]))
    monkeypatch.setattr(band_files, "WINDOW_ROWS", 1 << 40)
    whole = list(near_edges.range_edges(RangeTask(r, tuple(names[1:])), plan, (entry,)))
    assert any(a.committed for a, _b, _j in edges)
    assert [(a.doc_id, b.doc_id, j) for a, b, j in edges] == [(a.doc_id, b.doc_id, j) for a, b, j in whole]
    # damage is refused before any row is used, as when the file was read whole
    committed_path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(RunError, match="committed band index unusable"):
        list(near_edges.range_edges(RangeTask(r, tuple(names[1:])), plan, (entry,)))
    entry_wrong_range = dataclasses.replace(entry, range=2)
    committed_path.write_bytes(data)
    with pytest.raises(RunError, match="outside its range"):
        list(near_edges.range_edges(RangeTask(2, tuple(names[1:])), plan, (entry_wrong_range,)))


def test_hot_buckets_are_streamed_to_the_same_edges(tmp_path, monkeypatch):
    """Buckets over HOT_BUCKET_ROWS rows are made Nodes HOT_CHUNK at a time (edges.py hot_bucket_edges): the same edges
    (Nodes included: the copy of an id in the highest split, then the first unit), with and
    without committed members (incrementally: unit 0 committed, units 1 and 2 new)."""
    import hashlib  # noqa: PLC0415

    plan = make_plan(tmp_path)
    names = stage_units(plan)
    members = []
    for r in range(band_index.BAND_RANGES):
        committed_path = tmp_path / f"committed-r{r:02d}.bin"
        data = one_window_index(plan, r, names[:1], ())
        committed_path.write_bytes(data)
        entry = CommittedBandFile("gen-0", f"gen-0/near-dedup/band-index-r{r:02d}.bin", r, len(data),
                                  hashlib.sha256(data).hexdigest(), str(committed_path))
        for task, committed in ((RangeTask(r, tuple(names)), ()), (RangeTask(r, tuple(names[1:])), (entry,))):
            whole = list(near_edges.range_edges(task, plan, committed))
            monkeypatch.setattr(near_edges, "HOT_BUCKET_ROWS", 1)
            monkeypatch.setattr(near_edges, "HOT_CHUNK", 2)
            streamed = list(near_edges.range_edges(task, plan, committed))
            monkeypatch.setattr(near_edges, "HOT_BUCKET_ROWS", 1 << 16)
            assert whole and sorted(streamed) == sorted(whole)  # in another order
            members += [n for e in whole for n in e[:2]]
    # copies of one id merged as merge_copies does: the highest split, then the first unit
    assert any(n.doc_id == 71 and n.split == 1 and n.loc[0] == "unit-2" for n in members)  # doc 10: unit 2 only
    assert any(n.doc_id == 85 and n.split == 1 and n.loc[0] == "unit-0" for n in members)  # doc 12: units 0, 2
    assert any(n.committed for n in members)
