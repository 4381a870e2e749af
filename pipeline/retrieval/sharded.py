"""Neighbours searched in R ranges of inverted lists, through the runner's own GroupByKey.

    queries (key, vector, exclusion) --Route--> (range, query) --GroupByKey--> SearchRange (one range's lists
    loaded per worker, queries in batches) --> (key, [(score, row)]) --GroupByKey--> Merge (cut at K by
    (score desc, row asc), exact re-rank from the stored vectors by (score desc, row asc)) --> (key, rows)

A worker holds one range's codes (range-<r>.faiss, written by `write_ranges`), the coarse quantizer (to route)
and a batch of queries; the full vectors are read row by row from a memory-mapped fp16 .npy
(transforms/retrieval/retrieval_rerank.py's FileRows: pread by row, so only the asked rows enter the worker).
Which rows a key gets is decided by transforms/retrieval/retrieval_ranges.py's rules alone, so the answer is the
same for every R, worker count and runner (tests/e2e/test_retrieval_sharded.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import apache_beam as beam
import numpy as np

from transforms.retrieval import retrieval_index, retrieval_ranges, retrieval_rerank
from transforms.retrieval.retrieval_index import Exclusion

QUERY_BATCH = 256


@dataclass(frozen=True)
class ShardedSearch:
    """Where a sharded index lives and how it is searched."""
    index_dir: str  # holds quantizer.faiss, range-<r>.faiss and vectors.npy (fp16)
    num_ranges: int
    k: int
    num_candidates: int  # K: candidates re-ranked exactly per query
    nprobe: int
    query_blocks: int = 1  # groups per range: ((range, block) keys let several workers load the same range)
    # [(first row, .npy path)] of the full vectors for re-ranking; () = index_dir's vectors.npy
    vector_files: tuple[tuple[int, str], ...] = ()


def range_file(index_dir: str, r: int) -> str:
    return os.path.join(index_dir, f"range-{r:05d}.faiss")


def write_ranges(index, vectors, index_dir: str, num_ranges: int) -> None:
    """The index cut into range files plus the routing copy (lists emptied) and the fp16 vectors (None: the
    caller writes vectors.npy itself, e.g. chunk by chunk); temp + rename."""
    os.makedirs(index_dir, exist_ok=True)
    data = retrieval_index.serialize(index)

    def put(name: str, payload: bytes) -> None:
        tmp = os.path.join(index_dir, name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(payload)
        os.replace(tmp, os.path.join(index_dir, name))

    # the router: every list emptied (range -1 matches none), only the coarse quantizer and rotation remain
    put("quantizer.faiss", retrieval_index.serialize(retrieval_ranges.range_index(data, -1, num_ranges)))
    for r in range(num_ranges):
        put(os.path.basename(range_file(index_dir, r)),
            retrieval_index.serialize(retrieval_ranges.range_index(data, r, num_ranges)))
    if vectors is not None:
        retrieval_rerank.write_fp16(os.path.join(index_dir, "vectors.npy"), vectors)


def _read(path: str):
    with open(path, "rb") as f:
        return retrieval_index.deserialize(f.read())


class Route(beam.DoFn):
    def __init__(self, search: ShardedSearch):
        self.search = search

    def setup(self):
        import faiss  # noqa: PLC0415

        faiss.omp_set_num_threads(1)
        self.router = _read(os.path.join(self.search.index_dir, "quantizer.faiss"))

    def process(self, query):
        key, vec, excl = query
        for r in retrieval_ranges.probe_ranges(self.router, vec[None, :], self.search.nprobe,
                                               self.search.num_ranges)[0]:
            # block by the key's first field (the dataset shard): stable across runners
            yield (r, int(key[0]) % self.search.query_blocks), query


class SearchRange(beam.DoFn):
    """One range's lists loaded (one range per worker at a time), its queries answered in batches."""

    def __init__(self, search: ShardedSearch):
        self.search = search

    def setup(self):
        import faiss  # noqa: PLC0415

        faiss.omp_set_num_threads(1)

    def process(self, element):
        (r, _block), queries = element
        s = self.search
        index = _read(range_file(s.index_dir, r))
        batch = []
        for q in queries:
            batch.append(q)
            if len(batch) == QUERY_BATCH:
                yield from self._batch(index, batch)
                batch = []
        if batch:
            yield from self._batch(index, batch)
        del index

    def _batch(self, index, batch):
        s = self.search
        vecs = np.stack([v for _, v, _ in batch])
        excl = [Exclusion(tuple(map(tuple, e[0])), tuple(e[1])) for _, _, e in batch]
        for (key, _, _), cands in zip(batch, retrieval_ranges.range_candidates(index, vecs, excl,
                                                                               s.num_candidates, s.nprobe)):
            yield key, cands


class MergeQuery(beam.DoFn):
    """Merge with the query vector joined by key (CoGroupByKey), so no side input holds every query."""

    def __init__(self, search: ShardedSearch):
        self.search = search

    def setup(self):
        files = self.search.vector_files or ((0, os.path.join(self.search.index_dir, "vectors.npy")),)
        self.rows = retrieval_rerank.FileRowsSet(files)

    def process(self, element):
        key, grouped = element
        vec = grouped["query"][0]
        cands = [c for part in grouped["cands"] for c in part]
        rows = retrieval_ranges.merge(vec, cands, self.search.num_candidates, self.search.k, self.rows)
        yield key, tuple(int(i) for i in rows)


def search_queries(queries, search: ShardedSearch, label: str = "Sharded"):
    """PCollection of (key, vector float32 [d], (ranges, ids)) -> PCollection of (key, tuple of k rows, -1 = none)."""
    cands = (queries | f"{label}Route" >> beam.ParDo(Route(search))
             | f"{label}ByRange" >> beam.GroupByKey()
             | f"{label}SearchRange" >> beam.ParDo(SearchRange(search)))
    vecs = queries | f"{label}QueryVector" >> beam.Map(lambda q: (q[0], q[1]))
    return ({"query": vecs, "cands": cands} | f"{label}ByQuery" >> beam.CoGroupByKey()
            | f"{label}Merge" >> beam.ParDo(MergeQuery(search)))
