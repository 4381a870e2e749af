"""Retrieval units without Beam: Faiss recall against exact search with same-document exclusion, BM25 against
brute force, chunking, and the sidecar codec (the MiniLM encoder through RunInference: test_build_index.py)."""
from __future__ import annotations

import numpy as np
import pytest

from model_contract import RetrievalSpec, TokenizerInfo
from model_contract.retrieval import decode_sidecar, encode_sidecar, sidecar_contract
from transforms.retrieval import retrieval_chunks, retrieval_encoders, retrieval_index
from transforms.retrieval.retrieval_index import Exclusion, IndexConfig


def clustered(n_docs=150, per_doc=20, dim=32, seed=0):
    """Vectors where each document's chunks sit near a document centre (like real text): the exact nearest
    neighbour of a chunk is almost always in its own document, so exclusion is what the test exercises."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n_docs, dim)).astype(np.float32)
    vecs = np.repeat(centres, per_doc, axis=0) + 0.35 * rng.normal(size=(n_docs * per_doc, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    return vecs.astype(np.float32), per_doc


def _exclusions(query_rows, per_doc, two_docs_every=5):
    out = []
    for n, r in enumerate(query_rows):
        d = r // per_doc
        ranges = [(d * per_doc, (d + 1) * per_doc)]
        if n % two_docs_every == 0:  # a query window spanning two documents: a union of ranges
            ranges.append(((d + 1) * per_doc, (d + 2) * per_doc))
        out.append(Exclusion(tuple(ranges)))
    return out


@pytest.mark.parametrize("spec,min_recall", [("Flat", 1.0), ("IVF32,Flat", 0.9), ("IVF32,SQ8", 0.85),
                                             ("IVF32,PQ8np", 0.3)])
def test_index_recall_against_exact_search_with_exclusion(spec, min_recall):
    vecs, per_doc = clustered()
    cfg = IndexConfig(spec, nprobe=16, train_size=2000, seed=1)
    sample = vecs[retrieval_index.training_sample(len(vecs), cfg.train_size, cfg.seed)]
    trained = retrieval_index.serialize(retrieval_index.train_index(vecs.shape[1], cfg, sample))
    # filled shard by shard, written and merged back in database order
    bounds = [0, 1000, 2100, len(vecs)]
    parts = [retrieval_index.serialize(retrieval_index.fill_part(trained, vecs[a:b], a))
             for a, b in zip(bounds, bounds[1:])]
    index = retrieval_index.merge_parts(trained, parts)
    assert index.ntotal == len(vecs)
    rows = np.arange(0, len(vecs), 7)[:300]
    excl = _exclusions(rows, per_doc)
    _, got = retrieval_index.dense_search(index, vecs[rows], excl, 2, nprobe=16)
    _, exact = retrieval_index.exact_search(vecs, vecs[rows], excl, 2)
    for e, g in zip(excl, got):
        assert not e.contains(g[g >= 0]).any()  # never a neighbour from an excluded document
    unfiltered = retrieval_index.exact_search(vecs, vecs[rows], [Exclusion()] * len(rows), 1)[1]
    assert np.mean([(u[0] // per_doc) == (r // per_doc) for u, r in zip(unfiltered, rows)]) > 0.5
    recall = np.mean([len(set(g) & set(x)) / 2 for g, x in zip(got, exact)])
    assert recall >= min_recall, f"{spec}: recall@2 {recall:.3f}"


def test_polysemous_pq_spec_is_refused():
    assert "np" in retrieval_index.validate_spec("IVF64,PQ16")
    assert retrieval_index.validate_spec("IVF64,PQ16np") is None
    assert IndexConfig("auto").resolve(1000).spec == "Flat"
    assert IndexConfig("auto").resolve(100_000).spec.startswith("IVF")
    big = IndexConfig("auto").resolve(10_000_000)
    assert big.spec.endswith(",PQ48np") and big.rerank > 0  # compressed + re-ranked
    assert "np" in retrieval_index.validate_spec("OPQ16,IVF64,PQ16")


def test_bm25_search_equals_brute_force_top_k():
    rng = np.random.default_rng(3)
    chunks = [rng.integers(0, 300, size=rng.integers(5, 40)) for _ in range(400)]
    scorer = retrieval_encoders.BM25Scorer.build(chunks)
    queries = [chunks[i] for i in range(0, 400, 9)]
    excl = [Exclusion(((i, i + 3),), ((i + 5) % 400,)) for i in range(0, 400, 9)]
    scores, ids = scorer.search(queries, excl, 3, max_terms=10_000)
    dense = np.zeros((len(queries), len(chunks)), np.float32)  # brute force: sum of the postings of each term
    post = scorer.postings.toarray()
    for r, q in enumerate(queries):
        for t in np.unique(q):
            row = np.searchsorted(scorer.vocab_ids, t)
            dense[r] += post[row]
    _, want = retrieval_index.topk_masked(dense, excl, 3, min_score=0.0)
    assert np.array_equal(ids, want)
    for e, g in zip(excl, ids):
        assert not e.contains(g[g >= 0]).any()


def test_query_chunks_name_every_document_present():
    seg = np.array([1, 1, 2, 2, 2, 2, 3, 0])
    ex = {"input_ids": np.arange(8), "segment_ids": seg, "positions": np.zeros(8, np.int64),
          "piece_doc_ids": np.array([11, 22, 33]), "piece_offsets": np.array([5, 0, 0])}
    qs = retrieval_chunks.query_chunks(ex, 2)
    assert [q.doc_ids for q in qs] == [(11,), (22,), (22,), (33,)]
    assert qs[3].tokens.tolist() == [6] and not qs[3].is_padding
    with pytest.raises(ValueError, match="piece is missing"):
        retrieval_chunks.assemble_document(1, [(0, [1, 2]), (3, [4])])


def test_sidecar_round_trip_uint16():
    tok = TokenizerInfo("sentencepiece", "x" * 64, 40_000, 1, 2, 0, 3)
    spec = RetrievalSpec(4, 2, 8, fingerprint="f")
    contract = sidecar_contract(16, tok, spec)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 40_000, size=(4, 2, 8))
    ids = rng.integers(-1, 1 << 62, size=(4, 2))
    idx = rng.integers(-1, 100, size=(4, 2))
    data = encode_sidecar(tokens, ids, idx, spec.token_dtype)
    got = decode_sidecar(data, contract)
    assert np.array_equal(got["neighbour_tokens"], tokens) and np.array_equal(got["neighbour_doc_ids"], ids)
    assert np.array_equal(got["neighbour_chunk_index"], idx)
    assert len(data) < tokens.size * 2 + 200  # two bytes per token id, not a varint each
