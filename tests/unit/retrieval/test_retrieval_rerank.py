"""Compressed index + exact re-ranking (transforms/retrieval/retrieval_rerank.py) and the range rules
(transforms/retrieval/retrieval_ranges.py): exclusion stays inside the search, ties break by row."""
from __future__ import annotations

import numpy as np
import pytest

from transforms.retrieval import retrieval_index, retrieval_ranges, retrieval_rerank
from transforms.retrieval.retrieval_index import Exclusion, IndexConfig

pytestmark = pytest.mark.retrieval_scale


def unit(n, d, seed):
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_opq_spec_is_accepted_and_auto_picks_pq_with_rerank_from_the_threshold():
    assert retrieval_index.validate_spec("OPQ48,IVF1024,PQ48np") is None
    assert "same m" in retrieval_index.validate_spec("OPQ32,IVF1024,PQ48np")
    big = IndexConfig().resolve(retrieval_index.COMPRESSED_MIN_CHUNKS)
    assert big.spec.endswith(f"PQ{retrieval_index.COMPRESSED_PQ}np") and big.rerank == retrieval_index.COMPRESSED_RERANK
    assert retrieval_index.validate_spec(big.spec) is None
    assert IndexConfig().resolve(retrieval_index.COMPRESSED_MIN_CHUNKS - 1).spec.endswith(",SQ8")
    assert IndexConfig.from_dict(big.to_dict()) == big
    # a config without re-ranking keeps the dict (and so the fingerprint) it had before the field existed
    assert "rerank" not in IndexConfig("IVF64,SQ8").to_dict()
    with pytest.raises(ValueError):
        IndexConfig.from_dict({**big.to_dict(), "rerank": -1})


def test_best_k_breaks_ties_by_row_and_counts_a_row_once():
    ids = np.array([[7, 3, 5, 3, -1]])
    scores = np.array([[0.5, 0.9, 0.9, 0.9, 1.0]], np.float32)
    s, i = retrieval_rerank.best_k(ids, scores, 3)
    assert i.tolist() == [[3, 5, 7]] and s[0, 0] == np.float32(0.9)


def test_reranked_search_excludes_inside_the_search_and_matches_exact(tmp_path):
    x = unit(3000, 32, 0)
    cfg = IndexConfig("IVF16,PQ8np", 16, 3000, 0, rerank=64)
    trained = retrieval_index.serialize(retrieval_index.train_index(32, cfg, x))
    index = retrieval_index.merge_parts(trained, [retrieval_index.serialize(retrieval_index.fill_part(trained, x, 0))])
    path = str(tmp_path / "v.npy")
    retrieval_rerank.write_fp16(path, x)
    rows = retrieval_rerank.open_rows(path)
    assert isinstance(rows, np.memmap) and rows.dtype == np.float16  # read by row from disk, not loaded
    q = x[:100]
    # each query excludes its own "document" (rows [10*i//10*10, +10)) and one equal-token id
    excl = [Exclusion(((i // 10 * 10, i // 10 * 10 + 10),), (2999 - i,)) for i in range(100)]
    searcher = retrieval_rerank.RerankedIndex(index, retrieval_rerank.row_reader(rows), 64)
    s, ids = searcher.search(q, excl, 2, nprobe=16)
    assert all(not e.contains(r).any() for e, r in zip(excl, ids))
    assert (ids >= 0).all() and (np.diff(s, axis=1) <= 0).all()
    _, exact = retrieval_index.exact_search(x, q, excl, 2)
    assert np.mean([len(set(a) & set(b)) / 2 for a, b in zip(ids, exact)]) >= 0.95


def test_cut_orders_by_score_then_row_whatever_the_ties():
    cands = [(0.5, 9), (0.7, 4), (0.5, 2), (0.7, 1), (0.5, 9)]
    assert retrieval_ranges.cut(cands, 3) == [1, 4, 2]
    assert retrieval_ranges.cut(list(reversed(cands)), 3) == [1, 4, 2]  # arrival order does not matter
    tied = [(0.5, r) for r in reversed(range(retrieval_ranges.TIE_SLACK + 4))]
    assert retrieval_ranges.cut(tied, 2) == [0, 1]  # any number of ties: decided by row


def test_ranges_partition_the_lists_and_their_candidates_union_to_the_whole_search():
    x = unit(2000, 16, 1)
    cfg = IndexConfig("IVF16,Flat", 4, 2000, 0)
    trained = retrieval_index.serialize(retrieval_index.train_index(16, cfg, x))
    whole = retrieval_index.merge_parts(trained, [retrieval_index.serialize(retrieval_index.fill_part(trained, x, 0))])
    data = retrieval_index.serialize(whole)
    parts = [retrieval_ranges.range_index(data, r, 4) for r in range(4)]
    assert sum(p.ntotal for p in parts) == whole.ntotal
    q, excl = x[:50], [Exclusion(((i, i + 1),)) for i in range(50)]
    full = retrieval_ranges.range_candidates(whole, q, excl, 10, 4)
    per = [retrieval_ranges.range_candidates(p, q, excl, 10, 4) for p in parts]
    for i in range(50):
        merged = retrieval_ranges.cut([c for p in per for c in p[i]], 10)
        assert merged == retrieval_ranges.cut(full[i], 10)
        assert i not in merged


def test_sharded_rows_reads_by_row_across_files_and_refuses_a_gap(tmp_path):
    x = unit(30, 8, 3)
    pieces = []
    for a, b in ((0, 10), (10, 25), (25, 30)):
        path = str(tmp_path / f"e{a}.npy")
        np.save(path, x[a:b])
        pieces.append((a, np.load(path, mmap_mode="r")))
    rows = retrieval_rerank.ShardedRows(list(reversed(pieces)))
    ids = np.array([29, 0, 10, 9, 24, 25])
    assert np.array_equal(rows(ids), x[ids])
    with pytest.raises(ValueError):
        retrieval_rerank.ShardedRows([pieces[0], pieces[2]])


def test_an_opq_spec_always_reranks():
    assert IndexConfig("OPQ16,IVF64,PQ16np").resolve(10).rerank == retrieval_index.COMPRESSED_RERANK
    assert IndexConfig("OPQ16,IVF64,PQ16np", rerank=8).resolve(10).rerank == 8


def test_file_rows_reads_the_asked_rows_and_refuses_out_of_range(tmp_path):
    x = unit(50, 8, 4)
    path = str(tmp_path / "v.npy")
    retrieval_rerank.write_fp16(path, x)
    rows = retrieval_rerank.FileRows(path)
    ids = np.array([49, 0, 7, 7])
    assert np.array_equal(rows(ids), x.astype(np.float16)[ids])
    with pytest.raises(IndexError):
        rows(np.array([50]))


@pytest.mark.parametrize("num_ranges", [1, 4])
def test_duplicate_database_chunks_tied_at_the_top_are_decided_by_row_not_refused(num_ranges):
    """review33: a database holding 12 copies of one chunk (boilerplate: a licence header in 12 files) gives
    every query near it 12 candidates of equal score; the range search fetched K + TIE_SLACK per range and `cut`
    raised TieOverflowError, failing the whole `retrieval neighbours --ranges` run. The stated rule (score desc,
    then row) decides them: the two lowest rows of the copies, for every R."""
    x = unit(400, 16, 3)
    dup_rows = np.arange(100, 400, 25)  # 12 rows, spread over the lists' ranges by row only
    x[dup_rows] = x[0]
    cfg = IndexConfig("IVF4,Flat", 4, 400, 0)
    trained = retrieval_index.serialize(retrieval_index.train_index(16, cfg, x))
    whole = retrieval_index.merge_parts(trained, [retrieval_index.serialize(retrieval_index.fill_part(trained, x, 0))])
    data = retrieval_index.serialize(whole)
    q, excl = x[:1], [Exclusion(((0, 1),))]  # the query is row 0's chunk, its own row excluded
    cands = [c for r in range(num_ranges)
             for c in retrieval_ranges.range_candidates(retrieval_ranges.range_index(data, r, num_ranges), q, excl,
                                                        2, 4)[0]]
    rows = retrieval_ranges.merge(q[0], cands, 2, 2, lambda ids: x[ids])
    assert rows.tolist() == dup_rows[:2].tolist()


def test_a_tie_longer_than_the_fetch_is_fetched_whole_whatever_faiss_returns_first(monkeypatch):
    """range_candidates against a search that returns tied rows highest row first (Faiss's order among equal
    scores is its own): 30 rows tie at the top, K = 2 fetches 10, so the range must fetch again until the tie
    ends, and the cut keeps rows 0 and 1 (score, then row), not the first two Faiss handed back."""
    tied = np.arange(29, -1, -1)  # the order this fake search returns them in

    def search(_index, queries, _exclusions, n, _nprobe):
        got = tied[:n]
        scores = np.full((len(queries), n), -1.0, np.float32)
        ids = np.full((len(queries), n), -1, np.int64)
        scores[:, :len(got)], ids[:, :len(got)] = 1.0, got
        return scores, ids

    monkeypatch.setattr(retrieval_index, "dense_search", search)
    (cands,) = retrieval_ranges.range_candidates(None, np.zeros((1, 4), np.float32), [Exclusion(())], 2, 4)
    assert sorted(r for _, r in cands) == list(range(30))
    assert retrieval_ranges.cut(cands, 2) == [0, 1]
