"""pipeline/retrieval/db_rows.py: the chunk database read by row group answers exactly what the whole-loaded
store.ChunkDatabase answers (exclusions, rows, continuations), across row groups and database shards."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.retrieval import db_rows, store
from pipeline.retrieval.sidecar_files import exclusion_for
from transforms.retrieval import retrieval_chunks

CHUNK = 4


def _database(tmp_path, swap: bool = False):
    """Two Parquet shards of 5-row groups; documents of 1-6 chunks (the last one short), one repeated chunk."""
    rng = np.random.default_rng(0)
    doc_ids, chunk_index, tokens = [], [], []
    for doc in range(0, 40, 2):  # even ids: odd ones are not in the database
        n = int(rng.integers(1, 7))
        for c in range(n):
            doc_ids.append(doc)
            chunk_index.append(c)
            tokens.append(rng.integers(5, 50, CHUNK if c < n - 1 else int(rng.integers(1, CHUNK + 1))).astype(np.int32))
    tokens[7] = tokens[30] = tokens[2].copy()  # equal tokens in other documents
    if swap:  # two documents' rows out of order across a row group boundary
        doc_ids[4], doc_ids[5] = doc_ids[5] + 100, doc_ids[4]
    hashes = [retrieval_chunks.token_hash(t) for t in tokens]
    cut = len(tokens) // 2
    shards = []
    for k, (lo, hi) in enumerate(((0, cut), (cut, len(tokens)))):
        path = f"chunks-{k}.parquet"
        pq.write_table(pa.table({"doc_id": pa.array(doc_ids[lo:hi], pa.int64()),
                                 "chunk_index": pa.array(chunk_index[lo:hi], pa.int32()),
                                 "source": pa.array(["s"] * (hi - lo), pa.string()),
                                 "tokens": pa.array(tokens[lo:hi], pa.list_(pa.int32())),
                                 "token_hash": pa.array(hashes[lo:hi], pa.int64())}),
                       str(tmp_path / path), row_group_size=5)
        shards.append(SimpleNamespace(path=path, first_id=lo, chunks=hi - lo))
    manifest = SimpleNamespace(shards=tuple(shards), chunk_len=CHUNK)
    whole = store.ChunkDatabase(str(tmp_path), manifest)
    whole.doc_ids = np.asarray(doc_ids, np.int64)
    whole.chunk_index = np.asarray(chunk_index, np.int32)
    whole.tokens = tokens
    whole.token_hash = np.asarray(hashes, np.int64)
    if not swap:
        whole._build_lookups()
    return manifest, whole


def test_exclusions_and_rows_read_by_row_group_equal_the_whole_database(tmp_path):
    manifest, whole = _database(tmp_path)
    assert pq.ParquetFile(str(tmp_path / "chunks-0.parquet")).num_row_groups > 2
    queries = [retrieval_chunks.QueryChunk(i, whole.tokens[r], docs)
               for i, (r, docs) in enumerate([(2, (0,)), (9, (1, 2)), (30, (6, 8, 9)), (40, (38,)), (11, (3,))])]
    got = db_rows.exclusions(str(tmp_path), manifest, queries)
    want = [exclusion_for(whole, q) for q in queries]
    assert got == want and len(got[0].ids) == 3  # rows 2, 7 and 30 share tokens
    rows = [0, 3, 17, len(whole) - 1, -1]
    span = -(-3 * CHUNK // CHUNK) + 1
    part = db_rows.NeededRows(str(tmp_path), manifest, rows, span)
    for r in rows[:-1]:
        assert part.doc_ids[r] == whole.doc_ids[r] and part.chunk_index[r] == whole.chunk_index[r]
        assert np.array_equal(part.with_continuation(r, 3 * CHUNK, 0), whole.with_continuation(r, 3 * CHUNK, 0))
    assert 10 not in part.tokens  # a row no neighbour reaches is never kept
    r = next(i for i in range(len(whole) - 1) if whole.doc_ids[i + 1] == whole.doc_ids[i])
    with pytest.raises(KeyError):  # a continuation past the span refuses rather than writes less
        db_rows.NeededRows(str(tmp_path), manifest, [r], 1).with_continuation(r, 2 * CHUNK, 0)


def test_rows_out_of_document_order_are_refused(tmp_path):
    manifest, _ = _database(tmp_path, swap=True)
    with pytest.raises(ValueError, match="not in document order"):
        db_rows.exclusions(str(tmp_path), manifest, [retrieval_chunks.QueryChunk(0, np.arange(3), (0,))])
