"""Neighbours searched in ranges of inverted lists through Beam's GroupByKey (pipeline/retrieval/sharded.py):
the same rows for R = 1 and R = 4, for one and two workers, never a row of the query's own document."""
from __future__ import annotations

import hashlib
import json

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.retrieval import sharded
from transforms.retrieval import retrieval_index, retrieval_rerank
from transforms.retrieval.retrieval_index import Exclusion, IndexConfig

pytestmark = pytest.mark.retrieval_scale

DIM, N, DOC_LEN, NLIST = 32, 4000, 8, 32


def clustered(n, seed):
    """Unit vectors around 64 centres (structure like real embeddings, so IVF probes matter)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((64, DIM)).astype(np.float32)
    x = centres[rng.integers(0, 64, n)] + 0.35 * rng.standard_normal((n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def database():
    vecs = clustered(N, 0)
    cfg = IndexConfig(f"IVF{NLIST},PQ8np", nprobe=6, train_size=N, seed=0, rerank=16)
    trained = retrieval_index.serialize(retrieval_index.train_index(DIM, cfg, vecs))
    parts = [retrieval_index.serialize(retrieval_index.fill_part(trained, vecs[a:a + 1000], a))
             for a in range(0, N, 1000)]
    return vecs, retrieval_index.merge_parts(trained, parts)


def query_elements(vecs, n=300, seed=1):
    """(key, vector, exclusion) with the query's own document's rows excluded: documents are DOC_LEN rows."""
    rng = np.random.default_rng(seed)
    rows = np.sort(rng.choice(N, n, replace=False))
    noise = 0.05 * rng.standard_normal((n, DIM)).astype(np.float32)
    q = vecs[rows] + noise
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    out = []
    for i, r in enumerate(rows):
        lo = int(r) // DOC_LEN * DOC_LEN
        out.append(((int(i) % 3, int(i), 0), q[i].astype(np.float32), (((lo, lo + DOC_LEN),), ())))
    return out


def run_sharded(tmp_path, index, vecs, queries, num_ranges, workers=1, blocks=1):
    d = tmp_path / f"r{num_ranges}-w{workers}-b{blocks}"
    sharded.write_ranges(index, vecs, str(d), num_ranges)
    search = sharded.ShardedSearch(str(d), num_ranges, k=2, num_candidates=16, nprobe=6, query_blocks=blocks)
    opts = PipelineOptions(flags=[], runner="FnApiRunner", direct_num_workers=workers,
                           direct_running_mode="multi_threading" if workers > 1 else "in_memory")
    with beam.Pipeline(options=opts) as p:
        out = sharded.search_queries(p | beam.Create(queries), search)
        _ = (out | beam.Map(lambda kv: json.dumps([list(kv[0]), list(kv[1])]))
             | beam.io.WriteToText(str(d / "out"), shard_name_template="-SS-of-NN"))
    lines = [json.loads(line) for f in sorted(d.glob("out-*")) for line in f.read_text().splitlines()]
    return sorted((tuple(k), tuple(v)) for k, v in lines)


def digest(results) -> str:
    return hashlib.sha256(json.dumps(results).encode()).hexdigest()


def test_r1_and_r4_give_byte_identical_neighbours_for_one_and_two_workers(tmp_path, database):
    vecs, index = database
    queries = query_elements(vecs)
    r1 = run_sharded(tmp_path, index, vecs, queries, 1)
    r4 = run_sharded(tmp_path, index, vecs, queries, 4)
    r4w2 = run_sharded(tmp_path, index, vecs, queries, 4, workers=2, blocks=3)
    assert len(r1) == len(queries)
    assert digest(r1) == digest(r4) == digest(r4w2)
    # the ranges really split the work: with 4 ranges some queries touch more than one of them
    router = retrieval_index.deserialize((tmp_path / "r4-w1-b1" / "quantizer.faiss").read_bytes())
    from transforms.retrieval import retrieval_ranges
    touched = retrieval_ranges.probe_ranges(router, np.stack([q[1] for q in queries]), 6, 4)
    assert any(len(t) > 1 for t in touched) and len({r for t in touched for r in t}) == 4


def test_sharded_answer_equals_one_search_and_excludes_the_query_document(tmp_path, database):
    vecs, index = database
    queries = query_elements(vecs, n=200, seed=2)
    got = dict(run_sharded(tmp_path, index, vecs, queries, 4))
    q = np.stack([e[1] for e in queries])
    excl = [Exclusion(e[2][0], e[2][1]) for e in queries]
    whole = retrieval_rerank.RerankedIndex(index, retrieval_rerank.row_reader(vecs.astype(np.float16)), 16)
    _, ids = whole.search(q, excl, 2, nprobe=6)
    same = np.mean([tuple(int(x) for x in ids[i]) == got[e[0]] for i, e in enumerate(queries)])
    assert same >= 0.99  # equal but for exact float ties between the two code paths
    for e, ex in zip(queries, excl):
        rows = np.asarray([r for r in got[e[0]] if r >= 0])
        assert len(rows) == 2 and not ex.contains(rows).any()
    _, exact = retrieval_index.exact_search(vecs, q, excl, 2)
    recall = np.mean([len(set(got[e[0]]) & set(x)) / 2 for e, x in zip(queries, exact)])
    assert recall >= 0.75  # a floor on synthetic clusters (nprobe 6 of 32); real recall: bench/retrieval_bench.py
