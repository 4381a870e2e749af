"""The three bulk stages of the shard pipeline as plain functions (the Beam DoFns in pipeline/ wrap them).

  split_input_file  one input file      -> line-aligned zstd chunks in staging (+ dead letters for damage)
  tokenize_chunk    one chunk           -> a sorted unit (index + tokens) in staging (+ dead letters)
  pack_shard        one (split, shard)  -> one TFRecord shard, packed from its key range of every unit

Where one worker both cuts a file and tokenizes its chunks, the chunks skip the spill: InputCutter hands each
chunk's records to tokenize_records in memory (one chunk at a time). Each stage returns a small picklable result;
bulk data only ever moves between workers through files. File names depend only on the input and config, so a
retried bundle rewrites identical bytes (Beam may run a bundle twice).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from model_contract import frame_examples
from transforms.shard import corpus_stats, doc_ids, mixture
from transforms.shard.near_dedup import minhash, removals
from transforms.io import io_utils, read_parquet
from transforms.tokenize import tokenizer
from transforms.shard.documents import (DEAD_LETTER, HASHED, SPLIT_SHIFT, SPLITS, Document, assign_split, parse_record,
                                  shard_key_range, sort_key, split_wins)
from transforms.shard import packing_stats
from transforms.shard.best_fit import DEFAULT_WINDOW_EXAMPLES, pack_best_fit
from transforms.shard.packing import pack_blocks
from transforms.io.read_records import DEFAULT_MAX_ZSTD_WINDOW_BYTES, FileDamage, compression_of, iter_raw_records
from transforms.shard.spill import (INDEX_DTYPE, ChunkWriter, iter_chunk, read_index_range, read_index_rows,
                              read_token_range, write_index)

TOKENIZE_BATCH_DOCS = 64
TOKENIZE_BATCH_CHARS = 1 << 20
# What one record costs the tokenize stage beyond its bytes (index row, token array, or a dead-letter row:
# measured 225-480 bytes). A chunk closes at unit_bytes of raw bytes *plus* this per record, so 32 MiB of tiny or
# blank or broken lines cannot become tens of millions of records held by one worker.
RECORD_OVERHEAD_BYTES = 256


def _never() -> None:
    """The default `check_cancelled`: a run driven from outside a pipeline is never cancelled."""


@dataclass
class FileStats:
    """Record counts of (part of) one input file: every record read is written, filtered or dead-lettered,
    each with a reason. Stages count what they settle; pipeline/shard/manifest_builder.py sums them per file
    and checks read == written + filtered + dead-lettered before anything is committed."""
    read: int = 0
    written: int = 0
    filtered: dict = field(default_factory=dict)  # reason -> count
    dead_lettered: dict = field(default_factory=dict)  # reason -> count

    def filter(self, reason: str, n: int = 1) -> None:
        self.filtered[reason] = self.filtered.get(reason, 0) + n

    def dead_letter(self, reason: str, n: int = 1) -> None:
        self.dead_lettered[reason] = self.dead_lettered.get(reason, 0) + n

    def settled(self) -> int:
        return self.written + sum(self.filtered.values()) + sum(self.dead_lettered.values())

    def merge(self, other: "FileStats") -> "FileStats":
        self.read += other.read
        self.written += other.written
        for reason, n in other.filtered.items():
            self.filter(reason, n)
        for reason, n in other.dead_lettered.items():
            self.dead_letter(reason, n)
        return self

    def to_dict(self) -> dict:
        """The manifest's form (`records` and each `inputs` row; model_contract/manifest.py RecordCounts)."""
        return {"read": self.read, "written": self.written, "filtered": dict(sorted(self.filtered.items())),
                "dead_lettered": dict(sorted(self.dead_lettered.items()))}

    @classmethod
    def from_dict(cls, d: dict) -> "FileStats":
        return cls(d.get("read", 0), d.get("written", 0), dict(d.get("filtered", {})),
                   dict(d.get("dead_lettered", {})))


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
        return unit_name_of(self.file_idx, self.chunk_idx)


def unit_name_of(file_idx: int, chunk_idx: int) -> str:
    """The name of a file's chunk and of the unit tokenized from it."""
    return f"f{file_idx:06d}-c{chunk_idx:05d}"


def chunk_file(unit_name: str) -> str:
    """A spilled chunk's path under the staging directory (split_input_file writes it)."""
    return f"chunks/{unit_name}.rec.zst"


def chunk_spill_path(staging_dir: str, unit_name: str) -> str:
    return io_utils.join(staging_dir, chunk_file(unit_name))


@dataclass
class SplitResult:
    file_idx: int
    input_path: str
    chunks: list  # [ChunkRef]
    stats: FileStats  # records this stage settled itself (damage)
    dead_letter_path: Optional[str]
    spilled: bool = True  # its chunks are files in staging (split_input_file); else they went straight on


class InputCutter:
    """The records of one input file cut into line-aligned chunks of about `chunk_bytes` (at most `unit_bytes`)
    of raw lines plus RECORD_OVERHEAD_BYTES per record: `chunks()` yields (ChunkRef without a path, [(line,
    bytes)]) one chunk at a time; unreadable input becomes `damages` (dead-letter rows) and `stats`.

    Both ways of splitting cut here, so their chunks (and the units named after them) are the same: spilled to
    staging (`split_input_file`) or handed straight to the tokenizer in the same worker
    (pipeline/shard/shard_pipeline.py SplitAndTokenizeFile). Parquet files (transforms/io/read_parquet.py) give one
    record per row holding `fields` (text, source fields); a row group may hold up to 4 * unit_bytes of those
    columns (at least max_line_bytes). `check_cancelled` is called before each chunk and raises when the driver
    has given up on the run (pipeline/shard/cancel.py)."""

    def __init__(self, file_idx: int, input_path: str, unit_bytes: int, max_line_bytes: int,
                 max_zstd_window_bytes: int = DEFAULT_MAX_ZSTD_WINDOW_BYTES,
                 fields: tuple = ("text", "meta.pile_set_name"), check_cancelled: Callable[[], None] = _never,
                 chunk_bytes: Optional[int] = None):
        self.file_idx, self.input_path = file_idx, input_path
        self.unit_bytes, self.max_line_bytes = unit_bytes, max_line_bytes
        self.max_zstd_window_bytes = max_zstd_window_bytes
        self.fields, self.check_cancelled = fields, check_cancelled
        self.cut_at = unit_bytes if chunk_bytes is None else min(chunk_bytes, unit_bytes)
        self.stats = FileStats()
        self.damages: list = []
        self.refs: list = []  # ChunkRef of every chunk yielded so far, without a path

    def chunks(self):
        records: list = []
        raw_bytes = 0
        with io_utils.open_read(self.input_path) as f:
            items = (read_parquet.iter_parquet_records(f, self.fields[0], self.fields[1:], self.max_line_bytes,
                                                       4 * self.unit_bytes)
                     if read_parquet.is_parquet(self.input_path)
                     else iter_raw_records(f, compression_of(self.input_path), self.max_line_bytes,
                                           self.max_zstd_window_bytes))
            for item in items:
                if isinstance(item, FileDamage):
                    self.stats.read += 1
                    self.stats.dead_letter(item.reason)
                    self.damages.append(dead_letter_row(self.input_path, item.line, item.reason, item.excerpt,
                                                        item.detail))
                    continue
                if not records:
                    self.check_cancelled()
                records.append((item.line, item.data))
                raw_bytes += len(item.data)
                if raw_bytes + len(records) * RECORD_OVERHEAD_BYTES >= self.cut_at:
                    yield self._chunk(records, raw_bytes)
                    records, raw_bytes = [], 0
        if records:
            yield self._chunk(records, raw_bytes)

    def _chunk(self, records: list, raw_bytes: int) -> tuple:
        ref = ChunkRef(self.file_idx, self.input_path, len(self.refs), "", len(records), raw_bytes)
        self.refs.append(ref)
        return ref, records

    def finish(self, data_dir: str, chunks: list, spilled: bool) -> "SplitResult":
        """The file's SplitResult once every chunk is out, its damages written as dead letters."""
        dl_path = None
        if self.damages:
            dl_path = io_utils.join(data_dir, "dead_letter", f"f{self.file_idx:06d}-read.jsonl")
            io_utils.write_jsonl(dl_path, self.damages)
        return SplitResult(self.file_idx, self.input_path, chunks, self.stats, dl_path, spilled)


def split_input_file(file_idx: int, input_path: str, staging_dir: str, data_dir: str, unit_bytes: int,
                     max_line_bytes: int, max_zstd_window_bytes: int = DEFAULT_MAX_ZSTD_WINDOW_BYTES,
                     fields: tuple = ("text", "meta.pile_set_name"),
                     check_cancelled: Callable[[], None] = _never,
                     chunk_bytes: Optional[int] = None) -> SplitResult:
    """Stream one input file into chunks (InputCutter) written to staging as zstd chunk files; damage becomes dead
    letters. For the runners that spread one file's chunks over many workers (and for the near-dedup stage,
    which reads the chunks again)."""
    cutter = InputCutter(file_idx, input_path, unit_bytes, max_line_bytes, max_zstd_window_bytes, fields,
                         check_cancelled, chunk_bytes)
    chunks = []
    for ref, records in cutter.chunks():
        path = chunk_spill_path(staging_dir, ref.unit_name)
        with io_utils.open_write(path) as stream:
            writer = ChunkWriter(stream)
            for line, data in records:
                writer.add(line, data)
            writer.close()
        chunks.append(dataclasses.replace(ref, chunk_path=path))
    return cutter.finish(data_dir, chunks, spilled=True)


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
    stats: FileStats  # this chunk's records (written is settled later by pack)
    dead_letter_path: Optional[str]
    source_stats: dict = field(default_factory=dict)  # transforms/shard/corpus_stats.py, before dedup
    # First index row of a held-out split (val, then test: the split is the sort key's top bits), so the global
    # dedup pass reads them with one ranged read, no search. tokenize_chunk always sets it; None (a unit built
    # by hand, as some tests do) makes the pass search the index instead.
    held_out_start: Optional[int] = None
    # A fast tokenizer backend's spot check over this chunk (transforms/tokenize/tokenizer_backends.py): documents
    # and bytes seen and re-encoded with the reference; empty with the reference itself.
    spot_checked: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TokenizeSettings:
    text_field: str
    source_fields: tuple
    val_fraction: float
    test_fraction: float
    seed: int
    input_splits: tuple = ()  # per file_idx: HASHED (train inputs) or the split a --val/--test-input goes to
    long_documents: Optional[object] = None  # transforms/tokenize/long_documents.py: LongDocuments
    # --near-dedup with word shingles and nothing else reading the text (no --near-dedup-verify, no
    # --decontaminate): sign each document here, where its text is already in memory, and stage the signatures
    # (`unit_signatures_path`); the near-dedup stage reads them instead of re-reading and parsing the chunk.
    near_dedup_params: Optional[minhash.MinHashParams] = None

    def input_split(self, file_idx: int) -> int:
        return self.input_splits[file_idx] if file_idx < len(self.input_splits) else HASHED


def unit_signatures_dtype(num_perm: int) -> np.dtype:
    """A staged signature row: the document's line in its input file and its `num_perm` one-permutation values."""
    return np.dtype([("line", "<u8"), ("sig", minhash.SIGNATURE_DTYPE, (num_perm,))])


def unit_signatures_path(staging_dir: str, unit_name: str) -> str:
    """The tokenize stage's near-dedup signatures of a unit's documents (TokenizeSettings.near_dedup_params)."""
    return io_utils.join(staging_dir, "near-dedup", "unit-signatures", unit_name + ".sigs")


def tokenize_chunk(chunk: ChunkRef, sp, token_dtype: np.dtype, settings: TokenizeSettings, staging_dir: str,
                   data_dir: str, byte_mask: Optional[np.ndarray] = None,
                   check_cancelled: Callable[[], None] = _never) -> UnitResult:
    """Parse, validate and tokenize one chunk file (split_input_file); write its documents sorted by seeded sort
    key (tokenize_records)."""
    with io_utils.open_read(chunk.chunk_path) as f:
        return tokenize_records(chunk, iter_chunk(f), sp, token_dtype, settings, staging_dir, data_dir, byte_mask,
                                check_cancelled)


def tokenize_records(chunk: ChunkRef, records, sp, token_dtype: np.dtype, settings: TokenizeSettings,
                     staging_dir: str, data_dir: str, byte_mask: Optional[np.ndarray] = None,
                     check_cancelled: Callable[[], None] = _never) -> UnitResult:
    """Parse, validate and tokenize one chunk's (line, bytes) records; write its documents sorted by seeded sort
    key as the unit named after the chunk.

    `byte_mask`: corpus_stats.byte_piece_mask(sp), computed once per worker by the caller (it asks the model
    about every piece: ~30 ms per call with a 32k vocabulary, which per chunk would be ~1% of the job)."""
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
    sig_file = files.enter_context(io_utils.open_write(unit_signatures_path(staging_dir, chunk.unit_name))) \
        if signing is not None else None

    def flush():
        nonlocal batch, batch_chars
        if not batch:
            return
        check_cancelled()  # between batches (~0.1 s of tokenizing each): see pipeline/shard/cancel.py
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
        raise IOError(f"{chunk.chunk_path}: holds {stats.read} records, the split stage wrote {chunk.records}")

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
    held_out_start = int(np.searchsorted(index["key"], np.uint64(1 << SPLIT_SHIFT))) if rows else 0
    spot = {k: v - spot_before.get(k, 0) for k, v in getattr(sp, "counts", {}).items()}
    return UnitResult(name, chunk.file_idx, chunk.input_path, index_path, tokens_path, len(rows),
                      token_dtype.str, sources, split_tokens, stats, dl_path, source_stats, held_out_start, spot)


def spot_check_totals(units) -> dict:
    """The fast backend's spot-check counts summed over a run's units (for the manifest's tokenizer_backend)."""
    total: dict = {}
    for unit in units:
        for k, v in getattr(unit, "spot_checked", {}).items():
            total[k] = total.get(k, 0) + v
    return total


# ------------------------------------------------------------------------------------------------ dedup
@dataclass(frozen=True)
class DedupInputs:
    """What a packer needs to drop exact duplicates that live outside its own shard (transforms/shard/doc_ids.py).

    Copies of one document in one split share a sort key, so they meet in one shard and the packer keeps the
    first. Copies in *different* splits (a --val-input document also in a train file) never meet: the
    global pass `index_held_out_ids` lists each held-out split's ids once, and a packer drops a document that a
    winning split (`split_wins`) also holds. Copies in committed generations (`--incremental`) are found in
    their id indexes."""
    held_out: tuple = ()  # (split, path of its sorted id file) for val and test
    committed: tuple = ()  # id index paths of every committed generation

    def losers_to(self, split: int) -> list:
        return [path for s, path in self.held_out if split_wins(s, split)]


def index_held_out_ids(units: list, staging_dir: str) -> DedupInputs:
    """The one global dedup step: every val and test document id, sorted, one small file per split.

    Reads only the held-out rows of each unit's index (they sit at the end, the split being the key's top bits;
    tokenize recorded where they start, so one ranged read per unit and no search), so the cost follows the
    held-out documents, and memory is 8 bytes per held-out id."""
    parts = {split: [] for split in range(1, len(SPLITS))}
    for unit in units:
        if unit.n_docs == 0:
            continue
        with io_utils.open_read(unit.index_path) as f:
            if unit.held_out_start is None:
                rows = read_index_range(f, unit.n_docs, 1 << SPLIT_SHIFT, len(SPLITS) << SPLIT_SHIFT)
            elif unit.held_out_start < unit.n_docs:
                rows = read_index_rows(f, unit.held_out_start, unit.n_docs - unit.held_out_start)
            else:
                continue
        split_of_row = rows["key"] >> np.uint64(SPLIT_SHIFT)
        for split in parts:
            parts[split].append(rows["doc_id"][split_of_row == split])
    held_out = []
    for split, arrays in parts.items():
        path = io_utils.join(staging_dir, "dedup", f"{SPLITS[split]}.ids")
        with io_utils.open_write(path) as f:
            doc_ids.write_sorted_ids(f, np.concatenate(arrays) if arrays else np.zeros(0, doc_ids.ID_DTYPE))
        held_out.append((split, path))
    return DedupInputs(held_out=tuple(held_out))


def duplicate_mask(rows: np.ndarray, split: int, dedup: Optional[DedupInputs]) -> np.ndarray:
    """Which of a shard's index rows are copies of a document kept elsewhere (winning split or committed)."""
    dup = np.zeros(rows.size, dtype=bool)
    if dedup is None or rows.size == 0:
        return dup
    ids = rows["doc_id"]
    for path in dedup.losers_to(split):
        dup |= doc_ids.member_of_sorted(ids, doc_ids.read_sorted_ids(path))
    for path in dedup.committed:
        dup |= doc_ids.IdIndex(path).contains(ids)
    return dup


GENERATION_ID_INDEX = "doc-ids.idx"


def write_generation_id_index(shard_results: list, data_dir: str) -> tuple:
    """Merge the shards' kept ids into the generation's id index; returns (path, documents, bytes, sha256)."""
    path = io_utils.join(data_dir, GENERATION_ID_INDEX)
    paths = [r.ids_path for r in sorted(shard_results, key=lambda r: (r.task.split, r.task.shard)) if r.ids_path]
    # Kept ids are unique across the generation's shards (one split and one shard per id), so n is their sum.
    n, size, sha = doc_ids.write_index(path, doc_ids.merge_sorted_files(paths),
                                       sum(r.ids_count for r in shard_results))
    return path, n, size, sha


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
    duplicates_per_source: dict = field(default_factory=dict)  # source of a dropped copy -> copies dropped
    ids_path: Optional[str] = None  # sorted ids of the documents kept by dedup (the generation's id index)
    ids_count: int = 0  # how many (repeats by a mixture weight count once; dropped ones are still kept)
    dropped_per_file: dict = field(default_factory=dict)  # input path -> documents a mixture weight < 1 dropped
    source_stats: dict = field(default_factory=dict)  # transforms/shard/corpus_stats.py, of what was written
    # near-dedup / decontamination (transforms/shard/near_dedup/removals.py): input path -> {reason: n}, and
    # reason -> {source: n}
    filtered_per_file: dict = field(default_factory=dict)
    filtered_per_source: dict = field(default_factory=dict)
    packing: dict = field(default_factory=dict)  # source -> counters (transforms/shard/packing_stats.py)


def _gather_shard_documents(task: ShardTask, units: list):
    """Index rows of every unit in this shard's key range, merged in key order, plus their token buffers."""
    lo, hi = shard_key_range(task.split, task.shard, task.num_shards)
    parts, buffers = [], []
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
    return merge_shard_parts(parts, buffers)


def merge_shard_parts(parts: list, buffers: list):
    """(rows, which, buffers): the parts' index rows merged in key order, `which` naming each row's buffer.

    parts[i] are one unit's rows in the shard's key range and buffers[i] = (unit position, token_start of its
    first row, its tokens). The order is total (file and line tell any two records apart), so it does not depend
    on the order the parts came in: the file spill and the runner's shuffle (transforms/shard/shard_shuffle.py) merge
    to the same rows."""
    if not parts:
        return np.zeros(0, dtype=INDEX_DTYPE), np.zeros(0, dtype=np.int64), buffers
    rows = np.concatenate(parts)
    which = np.concatenate([np.full(p.size, b, dtype=np.int64) for b, p in enumerate(parts)])
    order = np.lexsort((rows["line"], rows["file_idx"], rows["doc_id"], rows["key"]))
    return rows[order], which[order], buffers


def append_eos(body: np.ndarray, eos_id: int, cache: dict) -> np.ndarray:
    """A document's tokens with EOS appended, kept in the spill's dtype (uint16 for a 32k vocabulary): the packer
    casts every token to int64 once, as it copies it into its block, instead of a cast here and a copy there.
    Where the id does not fit that dtype, the result is int64. `cache` keeps the EOS array per dtype."""
    eos = cache.get(body.dtype)
    if eos is None:
        info = np.iinfo(body.dtype)
        eos = cache[body.dtype] = np.array([eos_id], dtype=body.dtype if info.min <= eos_id <= info.max else np.int64)
    return np.concatenate((body, eos))


def pack_shard(task: ShardTask, units: list, seq_len: int, eos_id: int, pad_id: int, data_dir: str,
               dedup: Optional[DedupInputs] = None, staging_dir: Optional[str] = None,
               mixture_weights: Optional[dict] = None, seed: int = 0,
               gathered: Optional[tuple] = None, packing: str = "concat",
               packing_window: int = DEFAULT_WINDOW_EXAMPLES) -> ShardResult:
    """Write one shard: its documents from every unit, deduplicated, weighted (train, transforms/shard/mixture.py),
    packed, framed, checksummed.

    Exact duplicates (one document id) are dropped first: a copy whose id a winning split or a committed
    generation holds (`dedup`), and every copy after the first inside the shard. With `staging_dir`, the ids
    kept by dedup (before mixture weights) go to a sorted id file there, merged later into the generation's id
    index, so a later duplicate of a document a weight dropped is still a duplicate, as in a full build.

    `gathered`: the shard's (rows, which, buffers), already merged by `merge_shard_parts` from the pieces the
    runner's shuffle delivered (transforms/shard/shard_shuffle.py); `units` then holds those pieces. Without it the
    packer gathers its key range from every unit's spill files.

    `packing`: "concat" (transforms/shard/packing.py) or "best-fit" (transforms/shard/best_fit.py, a window of
    `packing_window` examples' worth of tokens)."""
    rows, which, buffers = gathered if gathered is not None else _gather_shard_documents(task, units)
    elsewhere = duplicate_mask(rows, task.split, dedup)
    removed = removals.reasons_for(rows["doc_id"], task.split, staging_dir)  # after exact dedup
    filtered: dict = collections.defaultdict(collections.Counter)
    filtered_sources: dict = collections.defaultdict(collections.Counter)
    result = ShardResult(task, io_utils.join(data_dir, task.file_name), 0, 0, 0, 0, 0, "")
    sources: dict = collections.defaultdict(lambda: {"documents": 0, "tokens": 0})
    written: dict = collections.Counter()
    duplicates: dict = collections.Counter()
    duplicate_sources: dict = collections.Counter()
    kept_ids: list = []
    dropped: dict = collections.Counter()
    stats: dict = {}
    eos_of: dict = {}  # token dtype -> EOS as a 1-array of it
    packed: dict = {}  # source -> packing counters
    position = 0  # the concat packer's stream position: which examples a document spans follows from it

    def with_eos(body: np.ndarray) -> np.ndarray:
        return append_eos(body, eos_id, eos_of)

    def unique_documents():
        previous_doc = None
        # The index columns as Python ints, converted once per shard: a structured row's field and int() per
        # document cost more than the rest of this loop.
        columns = zip(rows["key"].tolist(), rows["doc_id"].tolist(), rows["source_idx"].tolist(),
                      rows["token_start"].tolist(), rows["n_tokens"].tolist(), which.tolist(), elsewhere.tolist())
        for i, (key, doc_id, source_idx, token_start, n_tokens, b, copy_elsewhere) in enumerate(columns):
            u, start, buf = buffers[b]
            unit = units[u]
            source_name = unit.sources[source_idx]
            if doc_id == previous_doc or copy_elsewhere:  # exact duplicate (same text): the kept copy is elsewhere
                duplicates[unit.input_path] += 1
                duplicate_sources[source_name] += 1
                corpus_stats.add_duplicate(stats, source_name)
                continue
            previous_doc = doc_id
            kept_ids.append(doc_id)
            if removed is not None and removed[i]:  # a near-copy or contaminated: its reason and keeper are staged
                filtered[unit.input_path][removed[i]] += 1
                filtered_sources[removed[i]][source_name] += 1
                continue
            a = token_start - start
            corpus_stats.add_unique(stats, source_name, n_tokens + 1)
            yield key, doc_id, source_name, (unit.input_path, buf[a:a + n_tokens])

    def on_dropped(_source_name, payload):
        dropped[payload[0]] += 1

    if mixture_weights and task.split == 0:
        lo, hi = shard_key_range(task.split, task.shard, task.num_shards)
        copies = mixture.arrange(unique_documents(), mixture_weights, seed, lo, hi, on_dropped)
    else:
        copies = ((doc_id, source_name, payload, 0) for _key, doc_id, source_name, payload in unique_documents())

    def documents():
        nonlocal position
        for doc_id, source_name, (input_path, body), repeat in copies:
            tokens = with_eos(body)
            packing_stats.add(packed, source_name, tokens.size,
                              packing_stats.pieces_of(packing, position, tokens.size, seq_len), seq_len)
            position += tokens.size
            source = sources[source_name]
            source["documents"] += 1
            source["tokens"] += tokens.size
            corpus_stats.add_written(stats, source_name, body.size)
            if repeat == 0:
                written[input_path] += 1
            result.documents += 1
            yield doc_id, tokens

    with io_utils.open_write(result.path) as raw, io_utils.HashingWriter(raw) as out:
        blocks = (pack_best_fit(documents(), seq_len, pad_id, packing_window) if packing == "best-fit"
                  else pack_blocks(documents(), seq_len, pad_id))
        for block in blocks:  # a block of examples: one encode call, no GIL
            out.write(frame_examples(block.columns(), block.examples))
            result.examples += block.examples
            result.tokens += block.examples * seq_len - block.padding
            result.padding_tokens += block.padding
    result.bytes, result.sha256 = out.bytes, out.sha256
    result.sources = {k: dict(v) for k, v in sorted(sources.items())}
    result.written_per_file = dict(sorted(written.items()))
    result.duplicates_per_file = dict(sorted(duplicates.items()))
    result.duplicates_per_source = dict(sorted(duplicate_sources.items()))
    result.dropped_per_file = dict(sorted(dropped.items()))
    result.source_stats = stats
    result.packing = {k: v for k, v in sorted(packed.items())}
    result.filtered_per_file = {p: dict(sorted(c.items())) for p, c in sorted(filtered.items())}
    result.filtered_per_source = {r: dict(sorted(c.items())) for r, c in sorted(filtered_sources.items())}
    if staging_dir is not None:
        result.ids_path = io_utils.join(staging_dir, "ids", task.file_name + ".ids")
        result.ids_count = len(kept_ids)
        with io_utils.open_write(result.ids_path) as f:
            doc_ids.write_sorted_ids(f, np.array(kept_ids, dtype=doc_ids.ID_DTYPE))
    return result
