"""Compressed codes in memory, exact re-ranking from disk: the index kind for databases whose full vectors do not
fit a worker.

The resident index is OPQ rotation + IVF + PQ (`OPQ<m>,IVF<n>,PQ<m>np`: m bytes of codes + 8 bytes of id per
vector). Its search already applies the same-document exclusion (retrieval_index.dense_search's selector), so every
candidate it returns is allowed; the top `rerank` candidates per query are then scored by the exact inner
product against the database's full vectors, read row by row from disk (an fp16 file, memory-mapped, never loaded
whole), and the best k kept. Re-ranking adds no id the search did not return, so exclusion cannot leak through
it. Ties break by (score desc, database row asc), the rule of retrieval_index.topk_masked, so a merge of partial
candidate lists (pipeline/retrieval/sharded.py) gives the same neighbours as one search.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from transforms.retrieval import retrieval_index

RERANK_DEFAULT = 64  # candidates re-ranked per query (bench/retrieval_bench.py: recall@2 vs candidates)


def write_fp16(path: str, vectors: np.ndarray) -> int:
    """The vectors as a .npy of float16 (what re-ranking reads); bytes written."""
    arr = np.ascontiguousarray(vectors, dtype=np.float16)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.save(f, arr)
    import os  # noqa: PLC0415

    os.replace(tmp, path)
    return os.path.getsize(path)


def open_rows(path: str) -> np.ndarray:
    """A memory-mapped [N, dim] array (read by row on demand, never whole)."""
    return np.load(path, mmap_mode="r")


def best_k(cand_ids: np.ndarray, cand_scores: np.ndarray, k: int) -> tuple:
    """Per row, the k best (score desc, id asc) of candidate lists (-1 = empty slot); (scores, ids) [n, k]."""
    n = len(cand_ids)
    out_s = np.full((n, k), -np.inf, np.float32)
    out_i = np.full((n, k), -1, np.int64)
    for r in range(n):
        ids, sc = cand_ids[r], cand_scores[r]
        live = ids >= 0
        ids, sc = ids[live], sc[live]
        ids, first = np.unique(ids, return_index=True)  # a row reported twice (two ranges) counts once
        sc = sc[first]
        order = np.lexsort((ids, -sc))[:k]
        out_i[r, :len(order)] = ids[order]
        out_s[r, :len(order)] = sc[order]
    return out_s, out_i


def exact_scores(rows: Callable[[np.ndarray], np.ndarray], queries: np.ndarray, cand_ids: np.ndarray) -> np.ndarray:
    """Exact inner products of each query with its candidates (float32 from the stored rows), -inf for -1."""
    out = np.full(cand_ids.shape, -np.inf, np.float32)
    live = cand_ids >= 0
    uniq = np.unique(cand_ids[live])  # sorted: sequential reads of the memory-mapped file
    if len(uniq) == 0:
        return out
    vecs = np.asarray(rows(uniq), dtype=np.float32)
    pos = np.searchsorted(uniq, cand_ids[live])
    q = np.asarray(queries, np.float32)
    rr = np.nonzero(live)[0]
    out[live] = np.einsum("ij,ij->i", q[rr], vecs[pos])
    return out


class FileRows:
    """Rows of a .npy read one by one with pread: only the asked rows enter the process (a memory map would count
    every touched page of the file in the worker's RSS, bench/retrieval_memory_bench.py)."""

    def __init__(self, path: str):
        import os  # noqa: PLC0415

        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            shape, fortran, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                                     else np.lib.format.read_array_header_2_0(f))
            self.offset = f.tell()
        if fortran or len(shape) != 2:
            raise ValueError(f"{path}: expected a C-order [rows, dim] array, got shape {shape}")
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.row_bytes = shape[1] * self.dtype.itemsize
        self.fd = os.open(path, os.O_RDONLY)

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        import os  # noqa: PLC0415

        ids = np.asarray(ids, np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.shape[0]):
            raise IndexError(f"row out of range [0, {self.shape[0]})")
        out = np.empty((len(ids), self.shape[1]), self.dtype)
        for j, i in enumerate(ids):
            out[j] = np.frombuffer(os.pread(self.fd, self.row_bytes, self.offset + int(i) * self.row_bytes), self.dtype)
        return out


class FileRowsSet:
    """Rows across several .npy files ([(first row, path)], e.g. a database's per-shard embeddings), each read by
    row with pread (FileRows): re-ranking touches only the candidates' rows, never a whole file."""

    def __init__(self, pieces: Sequence):
        pieces = sorted(pieces, key=lambda t: t[0])
        self.readers = [FileRows(path) for _, path in pieces]
        self.starts = np.asarray([first for first, _ in pieces], np.int64)
        for (first, _), reader, nxt in zip(pieces, self.readers, list(self.starts[1:]) + [None]):
            if nxt is not None and first + reader.shape[0] != nxt:
                raise ValueError(f"vector files do not tile the rows: {first}+{reader.shape[0]} != {nxt}")

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        which = np.searchsorted(self.starts, ids, side="right") - 1
        if len(ids) and which.min() < 0:
            raise IndexError(f"row {int(ids.min())} is before the first file's rows")
        out = np.empty((len(ids), self.readers[0].shape[1]), np.float32)
        for w in np.unique(which):
            sel = which == w
            out[sel] = self.readers[w](ids[sel] - self.starts[w])
        return out


def row_reader(array: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    return lambda ids: array[ids]


@dataclass
class RerankedIndex:
    """A compressed Faiss index plus a reader of the full vectors by database row."""
    index: object
    rows: Callable[[np.ndarray], np.ndarray]
    rerank: int = RERANK_DEFAULT

    def candidates(self, queries: np.ndarray, exclusions: Sequence, nprobe: int) -> tuple:
        """(exact scores, ids) [n, rerank] of the compressed search's top candidates, exclusion applied."""
        _, ids = retrieval_index.dense_search(self.index, queries, exclusions, self.rerank, nprobe)
        return exact_scores(self.rows, queries, ids), ids

    def search(self, queries: np.ndarray, exclusions: Sequence, k: int, nprobe: int = 64) -> tuple:
        scores, ids = self.candidates(queries, exclusions, nprobe)
        return best_k(ids, scores, k)


class ShardedRows:
    """Rows of the database's vectors across its shards' files ([(first_row, array)] in row order), each array
    memory-mapped where the file is local (read by row on demand), so re-ranking never loads the vectors whole."""

    def __init__(self, pieces: Sequence):
        pieces = sorted(pieces, key=lambda t: t[0])
        self.starts = np.asarray([p[0] for p in pieces], np.int64)
        self.arrays = [p[1] for p in pieces]
        for (first, arr), nxt in zip(pieces, list(self.starts[1:]) + [None]):
            if nxt is not None and first + len(arr) != nxt:
                raise ValueError(f"vector files do not tile the rows: {first}+{len(arr)} != {nxt}")

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, np.int64)
        which = np.searchsorted(self.starts, ids, side="right") - 1
        out = np.empty((len(ids), self.arrays[0].shape[1]), np.float32)
        for w in np.unique(which):
            sel = which == w
            out[sel] = self.arrays[w][ids[sel] - self.starts[w]]
        return out
