"""The tokenize stage: one chunk -> one unit (its documents' index rows sorted by seeded key, and their tokens)
in staging (+ dead letters).

A chunk comes from its spilled file (`tokenize_chunk`, after transforms/shard/cut.py cut_input_file) or straight
from the cutter in the same worker (`tokenize_records`); the unit's name and bytes are the same either way.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import numpy as np

from transforms.io import io_utils
from transforms.shard import corpus_stats, layout
from transforms.shard.near_dedup import minhash
from transforms.shard.cut import never_cancelled
from transforms.shard.documents import (DEAD_LETTER, HASHED, SPLIT_SHIFT, SPLITS, Document, assign_split,
                                        parse_record, sort_key)
from transforms.shard.layout import Layout
from transforms.shard.records import ChunkRef, FileStats, UnitResult, dead_letter_row
from transforms.shard.spill import INDEX_DTYPE, iter_chunk, write_index
from transforms.tokenize import tokenizer

TOKENIZE_BATCH_DOCS = 64
TOKENIZE_BATCH_CHARS = 1 << 20


@dataclass(frozen=True)
class TokenizeSettings:
    text_field: str
    source_fields: tuple[str, ...]
    val_fraction: float
    test_fraction: float
    seed: int
    input_splits: tuple[int, ...] = ()  # per file_idx: HASHED (train inputs) or the split a --val/--test-input goes to
    long_documents: Optional[object] = None  # transforms/tokenize/long_documents.py: LongDocuments
    # --near-dedup with word shingles and nothing else reading the text (no --near-dedup-verify, no
    # --decontaminate): sign each document here, where its text is already in memory, and stage the signatures
    # (transforms/shard/layout.py unit_signatures); the near-dedup stage reads them instead of re-reading and
    # parsing the chunk.
    near_dedup_params: Optional[minhash.MinHashParams] = None

    def input_split(self, file_idx: int) -> int:
        return self.input_splits[file_idx] if file_idx < len(self.input_splits) else HASHED


def unit_signatures_dtype(num_perm: int) -> np.dtype:
    """A staged signature row: the document's line in its input file and its `num_perm` one-permutation values."""
    return np.dtype([("line", "<u8"), ("sig", minhash.SIGNATURE_DTYPE, (num_perm,))])




def tokenize_chunk(chunk: ChunkRef, sp, token_dtype: np.dtype, settings: TokenizeSettings, staging_dir: str,
                   data_dir: str, byte_mask: Optional[np.ndarray] = None,
                   check_cancelled: Callable[[], None] = never_cancelled) -> UnitResult:
    """Parse, validate and tokenize one chunk file (transforms/shard/cut.py cut_input_file); write its documents
    sorted by seeded sort key (tokenize_records)."""
    with io_utils.open_read(chunk.chunk_path) as f:
        return tokenize_records(chunk, iter_chunk(f), sp, token_dtype, settings, staging_dir, data_dir, byte_mask,
                                check_cancelled)


def tokenize_records(chunk: ChunkRef, records, sp, token_dtype: np.dtype, settings: TokenizeSettings,
                     staging_dir: str, data_dir: str, byte_mask: Optional[np.ndarray] = None,
                     check_cancelled: Callable[[], None] = never_cancelled) -> UnitResult:
    """Parse, validate and tokenize one chunk's (line, bytes) records; write its documents sorted by seeded sort
    key as the unit named after the chunk.

    `byte_mask`: corpus_stats.byte_piece_mask(sp), computed once per worker by the caller (it asks the model
    about every piece; its cost per call: docs/BENCHMARKS.md, "Measured choices in the shard job")."""
    where = Layout(staging_dir, data_dir)
    stats = FileStats()
    dead: list = []
    sources: list = []
    source_idx: dict = {}
    rows: list = []  # (key, doc_id, line, source_idx) per document, parallel to token arrays
    arrays: list = []
    batch: list = []  # (line, Document)
    batch_chars = 0
    max_id = np.iinfo(token_dtype).max
    input_split = settings.input_split(chunk.file_idx)
    source_stats: dict = {}
    if byte_mask is None:
        byte_mask = corpus_stats.byte_piece_mask(sp)
    byte_range = corpus_stats.byte_id_range(byte_mask)
    spot_before = dict(getattr(sp, "counts", {}))
    signing = settings.near_dedup_params
    files = contextlib.ExitStack()
    sig_file = files.enter_context(io_utils.open_write(where.path(layout.unit_signatures(chunk.unit_name)))) \
        if signing is not None else None

    def flush():
        nonlocal batch, batch_chars
        if not batch:
            return
        check_cancelled()  # between batches (TOKENIZE_BATCH_DOCS documents or ~1 MiB): pipeline/shard/cancel.py
        encoded = tokenizer.encode_batch(sp, [doc.text for _, doc in batch], settings.long_documents)
        if sig_file is not None:  # the documents that get an index row, signed together
            kept = [(line, doc.text) for (line, doc), ids in zip(batch, encoded)
                    if not isinstance(ids, tokenizer.Rejected)]
            signed = np.zeros(len(kept), dtype=unit_signatures_dtype(signing.num_perm))
            signed["line"] = [line for line, _t in kept]
            signed["sig"] = minhash.word_signatures([t for _l, t in kept], signing)
            sig_file.write(signed.tobytes())
        for (line, doc), ids in zip(batch, encoded):
            if isinstance(ids, tokenizer.Rejected):  # pretoken_too_long, tokenizer_panic, tokenizer_drops_text (tokenizer.encode_batch)
                stats.dead_letter(ids.reason)
                dead.append(dead_letter_row(chunk.input_path, line, ids.reason, doc.text[:200], ids.detail))
                continue
            arr = np.asarray(ids)  # int32 from the tokenizer on
            if arr.size and int(arr.max()) > max_id:
                raise ValueError(f"token id {int(arr.max())} does not fit the spill dtype {token_dtype}")
            split = assign_split(doc.doc_id, input_split, settings.val_fraction, settings.test_fraction)
            if doc.source not in source_idx:
                source_idx[doc.source] = len(sources)
                sources.append(doc.source)
            rows.append((sort_key(doc.doc_id, split, settings.seed), doc.doc_id, line, source_idx[doc.source]))
            arrays.append(arr.astype(token_dtype))
            corpus_stats.add_tokenized(source_stats, doc.source, doc.text, arr, byte_mask, byte_range)
        batch, batch_chars = [], 0

    with files:
        for line, data in records:
            stats.read += 1
            result = parse_record(data, settings.text_field, settings.source_fields)
            if isinstance(result, Document):
                batch.append((line, result))
                batch_chars += len(result.text)
                if len(batch) >= TOKENIZE_BATCH_DOCS or batch_chars >= TOKENIZE_BATCH_CHARS:
                    flush()
                continue
            if result.kind == DEAD_LETTER:
                stats.dead_letter(result.reason)
                dead.append(dead_letter_row(chunk.input_path, line, result.reason, result.excerpt))
            else:
                stats.filter(result.reason)
        flush()
    if stats.read != chunk.records:  # the spill file lost records: fail loudly, never drop them
        raise IOError(f"{chunk.chunk_path}: holds {stats.read} records, the cut stage wrote {chunk.records}")

    index = np.zeros(len(rows), dtype=INDEX_DTYPE)
    if rows:
        index["key"] = [r[0] for r in rows]
        index["doc_id"] = [r[1] for r in rows]
        index["line"] = [r[2] for r in rows]
        index["source_idx"] = [r[3] for r in rows]
        index["n_tokens"] = [a.size for a in arrays]
        index["file_idx"] = chunk.file_idx
    order = np.lexsort((index["line"], index["doc_id"], index["key"]))
    index = index[order]
    lengths = index["n_tokens"].astype(np.int64)
    index["token_start"] = np.concatenate(([0], np.cumsum(lengths)[:-1])) if rows else []
    split_tokens = [0, 0, 0]
    for split in range(len(SPLITS)):
        in_split = (index["key"] >> np.uint64(62)) == split
        split_tokens[split] = int(lengths[in_split].sum() + in_split.sum())  # + one EOS per document

    name = chunk.unit_name
    index_path, tokens_path = where.path(layout.unit_index(name)), where.path(layout.unit_tokens(name))
    with io_utils.open_write(index_path) as f:
        write_index(f, index)
    with io_utils.open_write(tokens_path) as f:
        for i in order:
            f.write(arrays[i].tobytes())
    dl_path = None
    if dead:
        dl_path = where.path(layout.unit_dead_letters(name))
        io_utils.write_jsonl(dl_path, dead)
    held_out_start = int(np.searchsorted(index["key"], np.uint64(1 << SPLIT_SHIFT))) if rows else 0
    spot = {k: v - spot_before.get(k, 0) for k, v in getattr(sp, "counts", {}).items()}
    return UnitResult(name, chunk.file_idx, chunk.input_path, index_path, tokens_path, len(rows),
                      token_dtype.str, sources, split_tokens, stats, dl_path, source_stats, held_out_start, spot)


def spot_check_totals(units: Iterable[UnitResult]) -> dict[str, int]:
    """The fast backend's spot-check counts summed over a run's units (for the manifest's tokenizer_backend)."""
    total: dict = {}
    for unit in units:
        for k, v in getattr(unit, "spot_checked", {}).items():
            total[k] = total.get(k, 0) + v
    return total

