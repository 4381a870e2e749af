"""The cut stage: one input file -> line-aligned chunks (+ dead letters for damage).

Where one worker both cuts a file and tokenizes its chunks, the chunks skip the spill: InputCutter hands each
chunk's records to transforms/shard/tokenize_unit.py tokenize_records in memory (one chunk at a time); else
`cut_input_file` writes them to staging as zstd chunk files for the tokenize stage to read. Either way the
chunks, and the units named after them, are the same.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterator, Optional

from transforms.io import io_utils, read_parquet
from transforms.io.decompress import DEFAULT_MAX_ZSTD_WINDOW_BYTES
from transforms.io.read_records import FileDamage, compression_of, iter_raw_records
from transforms.shard import layout
from transforms.shard.layout import Layout
from transforms.shard.records import ChunkRef, CutResult, FileStats, dead_letter_row
from transforms.shard.spill import ChunkWriter

# What one record costs the tokenize stage beyond its bytes (index row, token array, or a dead-letter row:
# measured 225-480 bytes). A chunk closes at unit_bytes of raw bytes *plus* this per record, so 32 MiB of tiny or
# blank or broken lines cannot become tens of millions of records held by one worker.
RECORD_OVERHEAD_BYTES = 256


def never_cancelled() -> None:
    """The default `check_cancelled`: a run driven from outside a pipeline is never cancelled."""


class InputCutter:
    """The records of one input file cut into line-aligned chunks of about `chunk_bytes` (at most `unit_bytes`)
    of raw lines plus RECORD_OVERHEAD_BYTES per record: `chunks()` yields (ChunkRef without a path, [(line,
    bytes)]) one chunk at a time; unreadable input becomes `damages` (dead-letter rows) and `stats`.

    Both ways of cutting cut here, so their chunks (and the units named after them) are the same: spilled to
    staging (`cut_input_file`) or handed straight to the tokenizer in the same worker
    (pipeline/shard/stage_dofn.py CutAndTokenizeFile). Parquet files (transforms/io/read_parquet.py) give one
    record per row holding `fields` (text, source fields); a row group may hold up to 4 * unit_bytes of those
    columns (at least max_line_bytes). `check_cancelled` is called before each chunk and raises when the driver
    has given up on the run (pipeline/shard/cancel.py)."""

    def __init__(self, file_idx: int, input_path: str, unit_bytes: int, max_line_bytes: int,
                 max_zstd_window_bytes: int = DEFAULT_MAX_ZSTD_WINDOW_BYTES,
                 fields: tuple = ("text", "meta.pile_set_name"), check_cancelled: Callable[[], None] = never_cancelled,
                 chunk_bytes: Optional[int] = None):
        self.file_idx, self.input_path = file_idx, input_path
        self.unit_bytes, self.max_line_bytes = unit_bytes, max_line_bytes
        self.max_zstd_window_bytes = max_zstd_window_bytes
        self.fields, self.check_cancelled = fields, check_cancelled
        self.cut_at = unit_bytes if chunk_bytes is None else min(chunk_bytes, unit_bytes)
        self.stats = FileStats()
        self.damages: list[dict] = []
        self.refs: list[ChunkRef] = []  # every chunk yielded so far, without a path

    def chunks(self) -> Iterator[tuple[ChunkRef, list]]:
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

    def _chunk(self, records: list, raw_bytes: int) -> tuple[ChunkRef, list]:
        ref = ChunkRef(self.file_idx, self.input_path, len(self.refs), "", len(records), raw_bytes)
        self.refs.append(ref)
        return ref, records

    def finish(self, data_dir: str, chunks: list[ChunkRef], spilled: bool) -> CutResult:
        """The file's CutResult once every chunk is out, its damages written as dead letters."""
        dl_path = None
        if self.damages:
            dl_path = Layout("", data_dir).path(layout.cut_dead_letters(self.file_idx))
            io_utils.write_jsonl(dl_path, self.damages)
        return CutResult(self.file_idx, self.input_path, list(chunks), self.stats, dl_path, spilled)


def cut_input_file(file_idx: int, input_path: str, staging_dir: str, data_dir: str, unit_bytes: int,
                   max_line_bytes: int, max_zstd_window_bytes: int = DEFAULT_MAX_ZSTD_WINDOW_BYTES,
                   fields: tuple = ("text", "meta.pile_set_name"),
                   check_cancelled: Callable[[], None] = never_cancelled,
                   chunk_bytes: Optional[int] = None) -> CutResult:
    """Stream one input file into chunks (InputCutter) written to staging as zstd chunk files; damage becomes dead
    letters. For the runners that spread one file's chunks over many workers (and for the near-dedup stage,
    which reads the chunks again)."""
    cutter = InputCutter(file_idx, input_path, unit_bytes, max_line_bytes, max_zstd_window_bytes, fields,
                         check_cancelled, chunk_bytes)
    where = Layout(staging_dir, data_dir)
    chunks = []
    for ref, records in cutter.chunks():
        path = where.path(layout.chunk_file(ref.unit_name))
        with io_utils.open_write(path) as stream:
            writer = ChunkWriter(stream)
            for line, data in records:
                writer.add(line, data)
            writer.close()
        chunks.append(dataclasses.replace(ref, chunk_path=path))
    return cutter.finish(data_dir, chunks, spilled=True)
