"""The three bulk stages of the shard pipeline as plain functions (the Beam DoFns in pipeline/ wrap them).

  split_input_file  one input file      -> line-aligned zstd chunks in staging (+ dead letters for damage)
  tokenize_chunk    one chunk           -> a sorted unit (index + tokens) in staging (+ dead letters)
  pack_shard        one (split, shard)  -> one TFRecord shard, packed from its key range of every unit

Each returns a small picklable result; bulk data only ever moves through files. File names depend only on
the input and config, so a retried bundle rewrites identical bytes (Beam may run a bundle twice).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from model_contract import encode_example, frame_record
from transforms import io_utils, tokenizer
from transforms.documents import (DEAD_LETTER, SPLITS, Document, parse_record, shard_key_range, sort_key,
                                  split_of)
from transforms.packing import pack_documents
from transforms.read_records import DEFAULT_MAX_ZSTD_WINDOW_BYTES, FileDamage, compression_of, iter_raw_records
from transforms.spill import INDEX_DTYPE, ChunkWriter, iter_chunk, read_index_range, read_token_range, write_index

TOKENIZE_BATCH_DOCS = 64
TOKENIZE_BATCH_CHARS = 1 << 20
# What one record costs the tokenize stage beyond its bytes (index row, token array, or a dead-letter row:
# measured 225-480 bytes). A chunk closes at unit_bytes of raw bytes *plus* this per record, so 32 MiB of tiny or
# blank or broken lines cannot become tens of millions of records held by one worker.
RECORD_OVERHEAD_BYTES = 256


def _new_file_stats() -> dict:
    return {"read": 0, "written": 0, "filtered": {}, "dead_lettered": {}}


def _bump(counter: dict, reason: str, n: int = 1) -> None:
    counter[reason] = counter.get(reason, 0) + n


def merge_file_stats(into: dict, other: dict) -> dict:
    into["read"] += other["read"]
    into["written"] += other["written"]
    for kind in ("filtered", "dead_lettered"):
        for reason, n in other[kind].items():
            _bump(into[kind], reason, n)
    return into


def dead_letter_row(path: str, line: int, reason: str, excerpt: str, detail: str = "") -> dict:
    row = {"file": path, "line": line, "reason": reason, "excerpt": excerpt}
    if detail:
        row["detail"] = detail
    return row


# ------------------------------------------------------------------------------------------------ split
@dataclass(frozen=True)
class ChunkRef:
    file_idx: int
    input_path: str
    chunk_idx: int
    chunk_path: str
    records: int
    raw_bytes: int

    @property
    def unit_name(self) -> str:
        return f"f{self.file_idx:06d}-c{self.chunk_idx:05d}"


@dataclass
class SplitResult:
    file_idx: int
    input_path: str
    chunks: list  # [ChunkRef]
    stats: dict  # file stats for records this stage settled itself (damage)
    dead_letter_path: Optional[str]


def split_input_file(file_idx: int, input_path: str, staging_dir: str, data_dir: str, unit_bytes: int,
                     max_line_bytes: int, max_zstd_window_bytes: int = DEFAULT_MAX_ZSTD_WINDOW_BYTES) -> SplitResult:
    """Stream one input file into chunks of about `unit_bytes` of raw lines; damage becomes dead letters."""
    chunks: list = []
    damages: list = []
    stats = _new_file_stats()
    writer: Optional[ChunkWriter] = None
    stream = None

    def close_chunk():
        nonlocal writer, stream
        if writer is None:
            return
        writer.close()
        stream.close()
        ref = chunks[-1]
        chunks[-1] = ChunkRef(ref.file_idx, ref.input_path, ref.chunk_idx, ref.chunk_path, writer.records,
                              writer.raw_bytes)
        writer, stream = None, None

    with io_utils.open_read(input_path) as f:
        for item in iter_raw_records(f, compression_of(input_path), max_line_bytes, max_zstd_window_bytes):
            if isinstance(item, FileDamage):
                stats["read"] += 1
                _bump(stats["dead_lettered"], item.reason)
                damages.append(dead_letter_row(input_path, item.line, item.reason, item.excerpt, item.detail))
                continue
            if writer is None:
                idx = len(chunks)
                path = io_utils.join(staging_dir, "chunks", f"f{file_idx:06d}-c{idx:05d}.rec.zst")
                stream = io_utils.open_write(path)
                writer = ChunkWriter(stream)
                chunks.append(ChunkRef(file_idx, input_path, idx, path, 0, 0))
            writer.add(item.line, item.data)
            if writer.raw_bytes + writer.records * RECORD_OVERHEAD_BYTES >= unit_bytes:
                close_chunk()
    close_chunk()
    dl_path = None
    if damages:
        dl_path = io_utils.join(data_dir, "dead_letter", f"f{file_idx:06d}-read.jsonl")
        io_utils.write_jsonl(dl_path, damages)
    return SplitResult(file_idx, input_path, chunks, stats, dl_path)


# --------------------------------------------------------------------------------------------- tokenize
@dataclass
class UnitResult:
    name: str
    file_idx: int
    input_path: str
    index_path: str
    tokens_path: str
    n_docs: int
    token_dtype: str
    sources: list  # source names; index rows refer to them by position
    split_tokens: list  # tokens incl. EOS per split (train, val, test), before dedup
    stats: dict  # file stats for this chunk's records (written is settled later by pack)
    dead_letter_path: Optional[str]


@dataclass(frozen=True)
class TokenizeSettings:
    text_field: str
    source_fields: tuple
    val_fraction: float
    test_fraction: float
    seed: int


def tokenize_chunk(chunk: ChunkRef, sp, token_dtype: np.dtype, settings: TokenizeSettings, staging_dir: str,
                   data_dir: str) -> UnitResult:
    """Parse, validate and tokenize one chunk; write its documents sorted by seeded sort key."""
    stats = _new_file_stats()
    dead: list = []
    sources: list = []
    source_idx: dict = {}
    rows: list = []  # (key, doc_id, line, source_idx) per document, parallel to token arrays
    arrays: list = []
    batch: list = []  # (line, Document)
    batch_chars = 0
    max_id = np.iinfo(token_dtype).max

    def flush():
        nonlocal batch, batch_chars
        if not batch:
            return
        encoded = tokenizer.encode_batch(sp, [doc.text for _, doc in batch])
        for (line, doc), ids in zip(batch, encoded):
            arr = np.asarray(ids)  # int32 from the tokenizer on
            if arr.size and int(arr.max()) > max_id:
                raise ValueError(f"token id {int(arr.max())} does not fit the spill dtype {token_dtype}")
            split = split_of(doc.doc_id, settings.val_fraction, settings.test_fraction)
            if doc.source not in source_idx:
                source_idx[doc.source] = len(sources)
                sources.append(doc.source)
            rows.append((sort_key(doc.doc_id, split, settings.seed), doc.doc_id, line, source_idx[doc.source]))
            arrays.append(arr.astype(token_dtype))
        batch, batch_chars = [], 0

    with io_utils.open_read(chunk.chunk_path) as f:
        for line, data in iter_chunk(f):
            stats["read"] += 1
            result = parse_record(data, settings.text_field, settings.source_fields)
            if isinstance(result, Document):
                batch.append((line, result))
                batch_chars += len(result.text)
                if len(batch) >= TOKENIZE_BATCH_DOCS or batch_chars >= TOKENIZE_BATCH_CHARS:
                    flush()
                continue
            if result.kind == DEAD_LETTER:
                _bump(stats["dead_lettered"], result.reason)
                dead.append(dead_letter_row(chunk.input_path, line, result.reason, result.excerpt))
            else:
                _bump(stats["filtered"], result.reason)
    flush()
    if stats["read"] != chunk.records:  # the spill file lost records: fail loudly, never drop them
        raise IOError(f"{chunk.chunk_path}: holds {stats['read']} records, the split stage wrote {chunk.records}")

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
    index_path = io_utils.join(staging_dir, "units", name + ".index")
    tokens_path = io_utils.join(staging_dir, "units", name + ".tokens")
    with io_utils.open_write(index_path) as f:
        write_index(f, index)
    with io_utils.open_write(tokens_path) as f:
        for i in order:
            f.write(arrays[i].tobytes())
    dl_path = None
    if dead:
        dl_path = io_utils.join(data_dir, "dead_letter", name + ".jsonl")
        io_utils.write_jsonl(dl_path, dead)
    return UnitResult(name, chunk.file_idx, chunk.input_path, index_path, tokens_path, len(rows),
                      token_dtype.str, sources, split_tokens, stats, dl_path)


# ------------------------------------------------------------------------------------------------- pack
@dataclass(frozen=True)
class ShardTask:
    split: int
    shard: int
    num_shards: int

    @property
    def file_name(self) -> str:
        return f"{SPLITS[self.split]}-{self.shard:05d}-of-{self.num_shards:05d}.tfrecord"


@dataclass
class ShardResult:
    task: ShardTask
    path: str  # full path of the written shard
    examples: int
    tokens: int
    padding_tokens: int
    documents: int
    bytes: int
    sha256: str
    sources: dict = field(default_factory=dict)  # source -> {documents, tokens}
    written_per_file: dict = field(default_factory=dict)  # input path -> documents written
    duplicates_per_file: dict = field(default_factory=dict)  # input path -> exact duplicates dropped


def _gather_shard_documents(task: ShardTask, units: list):
    """Index rows of every unit in this shard's key range, merged in key order, plus their token buffers."""
    lo, hi = shard_key_range(task.split, task.shard, task.num_shards)
    parts, unit_of_row, buffers = [], [], []
    for u, unit in enumerate(units):
        if unit.n_docs == 0:
            continue
        with io_utils.open_read(unit.index_path) as f:
            rows = read_index_range(f, unit.n_docs, lo, hi)
        if rows.size == 0:
            continue
        start = int(rows["token_start"][0])
        count = int(rows["token_start"][-1] + rows["n_tokens"][-1]) - start
        with io_utils.open_read(unit.tokens_path) as f:
            buffers.append((u, start, read_token_range(f, np.dtype(unit.token_dtype), start, count)))
        parts.append(rows)
        unit_of_row.append(np.full(rows.size, len(buffers) - 1, dtype=np.int64))
    if not parts:
        return np.zeros(0, dtype=INDEX_DTYPE), np.zeros(0, dtype=np.int64), buffers
    rows = np.concatenate(parts)
    which = np.concatenate(unit_of_row)
    order = np.lexsort((rows["line"], rows["file_idx"], rows["doc_id"], rows["key"]))
    return rows[order], which[order], buffers


def pack_shard(task: ShardTask, units: list, seq_len: int, eos_id: int, pad_id: int, data_dir: str) -> ShardResult:
    """Write one shard: its documents from every unit, deduplicated, packed, framed, checksummed."""
    rows, which, buffers = _gather_shard_documents(task, units)
    result = ShardResult(task, io_utils.join(data_dir, task.file_name), 0, 0, 0, 0, 0, "")
    sources: dict = collections.defaultdict(lambda: {"documents": 0, "tokens": 0})
    written: dict = collections.Counter()
    duplicates: dict = collections.Counter()
    eos = np.array([eos_id], dtype=np.int64)

    def documents():
        previous_doc = None
        for row, b in zip(rows, which):
            u, start, buf = buffers[b]
            unit = units[u]
            doc_id = int(row["doc_id"])
            if doc_id == previous_doc:  # exact duplicate (same source and text): first occurrence wins
                duplicates[unit.input_path] += 1
                continue
            previous_doc = doc_id
            a = int(row["token_start"]) - start
            tokens = np.concatenate((buf[a:a + int(row["n_tokens"])].astype(np.int64), eos))
            source = sources[unit.sources[int(row["source_idx"])]]
            source["documents"] += 1
            source["tokens"] += tokens.size
            written[unit.input_path] += 1
            result.documents += 1
            yield doc_id, tokens

    with io_utils.open_write(result.path) as raw:
        out = io_utils.HashingWriter(raw)
        for example in pack_documents(documents(), seq_len, pad_id):
            out.write(frame_record(encode_example(example.features())))
            result.examples += 1
            result.tokens += seq_len - example.padding
            result.padding_tokens += example.padding
    result.bytes, result.sha256 = out.bytes, out.sha256
    result.sources = {k: dict(v) for k, v in sorted(sources.items())}
    result.written_per_file = dict(sorted(written.items()))
    result.duplicates_per_file = dict(sorted(duplicates.items()))
    return result
