"""Chunk database rows from shard provenance: pure functions, no Beam, no I/O.

A committed shard dataset already says where every token came from: each example's pieces carry the document
id (`piece_doc_ids`) and the token offset of the piece inside its document (`piece_offsets`). Re-assembling a
document is therefore a sort of its pieces by offset, with no re-tokenization and no chance of drifting from the
tokens the trainer sees. A document's chunks are its tokens cut every `chunk_len` (the last one may be short);
chunk ids are (document id, chunk index), stable across runs, workers and index rebuilds.

Database order is (document id, chunk index). Database shard k holds the document-id range
[k * 2^63 / n, (k+1) * 2^63 / n), so concatenating shards in order keeps that global order, and a chunk's dense
row number (its Faiss id) is a running count: every document's chunks are contiguous, which turns "exclude the
query's documents" into a handful of id ranges.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from model_contract import INPUT_IDS, PIECE_DOC_IDS, PIECE_OFFSETS, SEGMENT_IDS

DOC_ID_SPACE = 1 << 63


@dataclass(frozen=True)
class Piece:
    doc_id: int
    offset: int
    tokens: np.ndarray  # token ids of this piece, in document order


def pieces_of_example(example: dict) -> Iterator[Piece]:
    """The document pieces of one decoded example (padding dropped)."""
    seg = np.asarray(example[SEGMENT_IDS])
    ids = np.asarray(example[INPUT_IDS])
    for n, (doc, off) in enumerate(zip(example[PIECE_DOC_IDS], example[PIECE_OFFSETS]), start=1):
        yield Piece(int(doc), int(off), ids[seg == n])


def assemble_document(doc_id: int, pieces: Iterable) -> np.ndarray:
    """A document's tokens from its pieces [(offset, tokens)]; gaps or overlaps are an error (damaged input)."""
    ordered = sorted(pieces, key=lambda p: p[0])
    expected = 0
    for offset, tokens in ordered:
        if offset != expected:
            raise ValueError(f"document {doc_id:x}: piece at offset {offset}, expected {expected} "
                             "(a piece is missing or repeated: the shards do not hold the whole document)")
        expected += len(tokens)
    if not ordered:
        return np.zeros(0, np.int64)
    return np.concatenate([np.asarray(t, dtype=np.int64) for _, t in ordered])


def chunk_document(tokens: np.ndarray, chunk_len: int) -> list:
    """Cut a document every chunk_len tokens; the last chunk keeps what is left (never padded here)."""
    return [tokens[i:i + chunk_len] for i in range(0, len(tokens), chunk_len)]


def db_shard_of(doc_id: int, num_shards: int) -> int:
    """Range partition of the 63-bit document-id space: shard order = document-id order."""
    return (int(doc_id) * num_shards) >> 63


def token_hash(tokens) -> int:
    """63-bit hash of a chunk's token ids: finds chunks whose tokens equal a query's without comparing them all."""
    data = np.ascontiguousarray(np.asarray(tokens, dtype=np.int64)).tobytes()
    digest = hashlib.blake2b(data, digest_size=8, person=b"pileprep-chunk").digest()
    return int.from_bytes(digest, "little") >> 1


def db_rows(documents: Iterable, chunk_len: int) -> dict:
    """Column arrays for one database shard from (doc_id, source, tokens) triples, in database order."""
    doc_ids, chunk_index, sources, token_lists, hashes = [], [], [], [], []
    for doc_id, source, tokens in sorted(documents, key=lambda d: d[0]):
        chunks = chunk_document(np.asarray(tokens, dtype=np.int64), chunk_len)
        for i, chunk in enumerate(chunks):
            doc_ids.append(int(doc_id))
            chunk_index.append(i)
            sources.append(source)
            token_lists.append(chunk)
            hashes.append(token_hash(chunk))
    return {"doc_id": doc_ids, "chunk_index": chunk_index, "source": sources, "tokens": token_lists,
            "token_hash": hashes}


@dataclass(frozen=True)
class QueryChunk:
    """One chunk of a training example: its tokens, the documents it touches, and whether it is padding."""
    index: int  # chunk index inside the example
    tokens: np.ndarray  # non-padding tokens of the chunk (empty for a padding chunk)
    doc_ids: tuple[int, ...]  # sorted ids of every document with a token in this chunk

    @property
    def is_padding(self) -> bool:
        return self.tokens.size == 0


def query_chunks(example: dict, chunk_len: int) -> list:
    """Split an example into seq_len / chunk_len chunks, each with the documents present in it."""
    ids = np.asarray(example[INPUT_IDS])
    seg = np.asarray(example[SEGMENT_IDS])
    docs = np.asarray(example[PIECE_DOC_IDS])
    if ids.size % chunk_len:
        raise ValueError(f"seq_len {ids.size} is not a multiple of chunk_len {chunk_len}")
    out = []
    for c in range(ids.size // chunk_len):
        s = seg[c * chunk_len:(c + 1) * chunk_len]
        t = ids[c * chunk_len:(c + 1) * chunk_len]
        present = np.unique(s[s > 0])
        out.append(QueryChunk(c, t[s > 0], tuple(sorted({int(docs[p - 1]) for p in present}))))
    return out
