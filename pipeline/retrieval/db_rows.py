"""The chunk database read by Parquet row group, never whole, for `retrieval neighbours --ranges`
(pipeline/retrieval/neighbours_sharded.py): a worker holds one row group (65,536 rows, store.write_parquet) plus
what one dataset shard's queries need, however large the database.

- `exclusions`: the same Exclusion as sidecar_files.exclusion_for gives from a whole store.ChunkDatabase (the
  query's documents' row ranges, the rows of chunks with the query's tokens, sorted), from one pass over the
  doc_id and token_hash columns (16 B/row read, none kept but the matches).
- `NeededRows`: the rows a shard's sidecar names and the rows their continuations reach, read from only the
  row groups holding them; it answers doc_ids[i], chunk_index[i] and with_continuation like ChunkDatabase, so
  sidecar_files.neighbour_shard writes the same bytes.

The cost moved from memory to reading: each dataset shard's exclusion pass reads the two 8-byte columns of every
row group (docs/RETRIEVAL.md "Not done / limits" has the Pile-scale figure and the shuffle that would remove it).
"""
from __future__ import annotations

from typing import Callable, Iterator, Optional

import numpy as np

from model_contract.retrieval import DbManifest
from pipeline.retrieval import store
from transforms.io import io_utils
from transforms.retrieval import retrieval_chunks
from transforms.retrieval.retrieval_index import Exclusion


def row_groups(root: str, manifest: DbManifest, columns: list[str],
               wanted: Optional[Callable[[int, int], bool]] = None) -> Iterator[tuple[int, dict]]:
    """(first database row, numpy columns) per Parquet row group in database order; wanted(lo, hi) False skips
    the group [lo, hi) unread."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    for s in manifest.shards:
        first = int(s.first_id)
        with io_utils.open_read(io_utils.join(root, store.contained(s.path))) as f:
            pf = pq.ParquetFile(f)
            for g in range(pf.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                if wanted is None or wanted(first, first + n):
                    yield first, store.table_columns(pf.read_row_group(g, columns=columns))
                first += n


def exclusions(root: str, manifest: DbManifest, chunks: list) -> list[Exclusion]:
    """Per query chunk (retrieval_chunks.QueryChunk), its Exclusion, from one pass over the database."""
    hashes = [retrieval_chunks.token_hash(c.tokens) for c in chunks]
    docs = np.unique(np.asarray([d for c in chunks for d in c.doc_ids], np.int64))
    want_h = np.unique(np.asarray(hashes, np.int64))
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    same: dict[int, list[int]] = {}
    last = np.iinfo(np.int64).min
    for first, cols in row_groups(root, manifest, ["doc_id", "token_hash"]):
        d = cols["doc_id"]
        if len(d) and (d[0] < last or np.any(np.diff(d) < 0)):  # as store.ChunkDatabase refuses it
            raise ValueError(f"{root}: database rows are not in document order (at row {first})")
        last = d[-1] if len(d) else last
        at = np.flatnonzero(np.isin(d, docs))
        for i in at:  # rows are in document order: a document's rows are one run
            doc = int(d[i])
            lo.setdefault(doc, first + int(i))
            hi[doc] = first + int(i) + 1
        h = cols["token_hash"]
        for i in np.flatnonzero(np.isin(h, want_h)):
            same.setdefault(int(h[i]), []).append(first + int(i))
    return [Exclusion(tuple((lo[d], hi[d]) for d in c.doc_ids if d in lo), tuple(sorted(same.get(h, ()))))
            for c, h in zip(chunks, hashes)]


class NeededRows:
    """The database rows `rows` and the `span - 1` rows after each (their continuations), read by row group."""

    def __init__(self, root: str, manifest: DbManifest, rows, span: int):
        self.total = sum(int(s.chunks) for s in manifest.shards)
        base = np.unique(np.asarray([int(r) for r in rows if r >= 0], np.int64))
        need = np.unique((base[:, None] + np.arange(span)[None, :]).ravel()) if len(base) else base
        need = need[need < self.total]
        self.doc_ids: dict[int, int] = {}
        self.chunk_index: dict[int, int] = {}
        self.tokens: dict[int, np.ndarray] = {}

        def wanted(a: int, b: int) -> bool:
            i = int(np.searchsorted(need, a))
            return i < len(need) and need[i] < b

        for first, cols in row_groups(root, manifest, ["doc_id", "chunk_index", "tokens"], wanted):
            n = len(cols["doc_id"])
            for r in need[(need >= first) & (need < first + n)]:
                i = int(r) - first
                self.doc_ids[int(r)] = int(cols["doc_id"][i])
                self.chunk_index[int(r)] = int(cols["chunk_index"][i])
                self.tokens[int(r)] = np.array(cols["tokens"][i])  # a copy: the row group's buffer is freed

    def with_continuation(self, dense_id: int, length: int, pad_id: int) -> np.ndarray:
        # a row the span did not reach raises KeyError rather than writing a shorter continuation
        return store.continuation(self.doc_ids, self.tokens, self.total, dense_id, length, pad_id)
