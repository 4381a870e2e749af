"""Megatron-LM / NeMo / GPT-NeoX indexed datasets from a committed dataset: `<split>_text_document.bin/.idx`.

Megatron builds its own samples from documents, so the export holds documents, not packed examples: each one
rebuilt whole (its tokens and its EOS, as the tokenizer made them) from the pieces the shards' provenance names
(`piece_doc_ids`, `piece_offsets`; a piece's tokens are its segment's in `input_ids`). Documents come in the
order their first piece appears in the split's shards (manifest order): for `--packing concat` that is the order
the packer laid them, and a document's pieces follow each other; for `--packing best-fit`
(transforms/shard/best_fit.py) a document's pieces are in offset order but apart. A document never crosses a
shard (each shard is one packing group). A mixture weight's repeated copy (one id twice) is a document of its own.

Two passes over the split's shards, each through model_contract's checked reader: the first collects the pieces
(document id, offset, length) and gives each document its place in `.bin`; the second writes every piece's
tokens at its document's place plus its offset, in a file of the known size (so memory is the piece table, not
the tokens). A piece that continues no open document, a document with a gap, or one not ending in EOS is an
error naming the shard and record: nothing is written then.

The `.idx` is Megatron's `MMIDIDX` index (megatron/core/datasets/indexed_dataset.py `_IndexWriter`): version 1,
the dtype code, the sequence and document counts, int32 lengths, int64 byte pointers, int64 document indices
(one sequence per document). The dtype is the one Megatron picks for the vocabulary (`DType.optimal_dtype`):
uint16 below 65,500 ids, else int32. Tests read both back with megatron-core's own `IndexedDataset`.
"""
from __future__ import annotations

import struct

import numpy as np

from model_contract import INPUT_IDS, PIECE_DOC_IDS, PIECE_OFFSETS, SEGMENT_IDS, decode_example, resolve_shard_path
from model_contract.checked_reader import iter_checked_records
from transforms.io import io_utils

VERSION = 1
INDEX_HEADER = b"MMIDIDX\x00\x00"
DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}


class ExportError(ValueError):
    """The shards' provenance does not describe whole documents."""


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


def example_pieces(example: dict, where: str) -> tuple:
    """(doc ids, offsets, lengths, starts) of one decoded example's pieces, checked against its segment ids."""
    segments = example[SEGMENT_IDS]
    docs, offsets = example[PIECE_DOC_IDS], example[PIECE_OFFSETS]
    k = docs.size
    if offsets.size != k or (segments.size and (segments.min() < 0 or segments.max() > k)):
        raise ExportError(f"{where}: segment ids and pieces disagree")
    lengths = np.bincount(segments, minlength=k + 1)[1:]
    real = int(lengths.sum())
    if not np.array_equal(segments[:real], np.repeat(np.arange(1, k + 1), lengths)) or (lengths == 0).any():
        raise ExportError(f"{where}: pieces are not laid end to end from the example's start")
    starts = np.zeros(k, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return docs, offsets, lengths, starts


def _examples(job):
    """(where, decoded example) of every record of the split's shards, in manifest order."""
    for shard in job.shards:
        with io_utils.open_read(resolve_shard_path(job.manifest_file, shard)) as f:
            for r, record in enumerate(iter_checked_records(f, shard)):
                yield shard.path, r, decode_example(record)


def plan_documents(job) -> tuple:
    """Pass 1: (piece -> document number, piece offsets, document lengths), documents numbered by first
    appearance."""
    piece_doc, piece_offset = [], []
    lengths: list = []
    open_docs: dict = {}  # doc id -> [[document number, next offset], ...] of this shard
    shard_path = None
    for path, r, example in _examples(job):
        if path != shard_path:
            open_docs, shard_path = {}, path  # a document never crosses a shard
        docs, offsets, lens, _starts = example_pieces(example, f"{path} record {r}")
        for doc_id, offset, n in zip(docs.tolist(), offsets.tolist(), lens.tolist()):
            copies = open_docs.setdefault(doc_id, [])
            if offset == 0:
                copies.append([len(lengths), n])
                number = len(lengths)
                lengths.append(n)
            else:
                match = next((c for c in copies if c[1] == offset), None)
                if match is None:
                    raise ExportError(f"{path} record {r}: a piece of document {doc_id:x} at offset {offset} "
                                      f"continues no piece of it before (a gap, or pieces out of order)")
                number = match[0]
                match[1] += n
                lengths[number] += n
            piece_doc.append(number)
            piece_offset.append(offset)
    return (np.array(piece_doc, dtype=np.int64), np.array(piece_offset, dtype=np.int64),
            np.array(lengths, dtype=np.int64))


def write_bin(job, path: str, dtype: np.dtype, eos_id: int) -> np.ndarray:
    """Pass 2: every document's tokens at its place in `path`; returns the documents' lengths."""
    piece_doc, piece_offset, lengths = plan_documents(job)
    starts = np.zeros(lengths.size, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    total = int(lengths.sum())
    with open(path, "wb") as f:
        f.truncate(total * dtype.itemsize)
    if total == 0:
        return lengths
    out = np.memmap(path, dtype=dtype, mode="r+", shape=(total,))
    info = np.iinfo(dtype)
    p = 0
    for shard_path, r, example in _examples(job):
        ids = example[INPUT_IDS]
        _docs, _offsets, lens, at = example_pieces(example, f"{shard_path} record {r}")
        if ids.size and (ids.min() < info.min or ids.max() > info.max):
            raise ExportError(f"{shard_path} record {r}: a token id does not fit {dtype} (the vocabulary's dtype)")
        for n, a in zip(lens.tolist(), at.tolist()):
            dst = int(starts[piece_doc[p]] + piece_offset[p])
            out[dst:dst + n] = ids[a:a + n]
            p += 1
    out.flush()
    ends = out[starts + lengths - 1]
    if (ends != eos_id).any():
        bad = int(np.flatnonzero(ends != eos_id)[0])
        raise ExportError(f"split {job.split}: document {bad} does not end with EOS ({eos_id}): its pieces do not "
                          f"make it whole")
    del out
    return lengths


def index_bytes(lengths: np.ndarray, dtype: np.dtype) -> bytes:
    """Megatron's `.idx` for one sequence per document."""
    n = lengths.size
    pointers = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1] * dtype.itemsize, out=pointers[1:])
    return b"".join((INDEX_HEADER, struct.pack("<Q", 1), struct.pack("<B", DTYPE_CODES[dtype]),
                     struct.pack("<Q", n), struct.pack("<Q", n + 1), lengths.astype("<i4").tobytes(),
                     pointers.astype("<i8").tobytes(), np.arange(n + 1, dtype="<i8").tobytes()))


def write_split(job) -> list:
    tokenizer = job.manifest.contract.tokenizer
    dtype = token_dtype(tokenizer.vocab_size)
    prefix = f"{job.split}_text_document"
    lengths: list = []

    def fill_bin(tmp: str) -> None:
        lengths.append(write_bin(job, tmp, dtype, tokenizer.eos_id))

    rows = [job.put(prefix + ".bin", fill_bin)]

    def fill_idx(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(index_bytes(lengths[0], dtype))

    rows.append(job.put(prefix + ".idx", fill_idx))
    for row in rows:
        row["documents"] = int(lengths[0].size)
    return rows


def finish(job, splits: list, files: list) -> list:
    return []


def describe(manifest) -> dict:
    dtype = token_dtype(manifest.contract.tokenizer.vocab_size)
    return {"megatron": {"dtype": dtype.name, "document_prefix": "<split>_text_document",
                         "eos_id": manifest.contract.tokenizer.eos_id}}
