"""The spill formats that carry bulk data between pipeline stages through files, not through the runner.

Why: a Beam runner that buffers whole PCollections between stages (FnApiRunner does) would hold the corpus
in memory if raw lines or token arrays travelled as elements. Instead each stage writes its bulk output to
the run's staging directory and passes small descriptors on, so peak memory stays bounded by one work unit
or one shard, whatever the corpus size.

- chunk: a line-aligned slice of one input file, records framed as (line u64, length u64, bytes), zstd level 1.
- unit: the tokenized documents of one chunk, sorted by their seeded sort key:
    <unit>.index  fixed-width records (INDEX_DTYPE), sorted by (key, doc_id, line)
    <unit>.tokens token ids without EOS, concatenated in index order (u2 or u4)
  A shard is a contiguous key range, so its part of every unit is one binary search and one ranged read.
"""
from __future__ import annotations

import struct
from typing import BinaryIO, Iterator

import numpy as np
import zstandard

_RECORD_HEADER = struct.Struct("<QQ")

INDEX_DTYPE = np.dtype([
    ("key", "<u8"),  # split in the top 2 bits, seeded order below (transforms.shard.documents.sort_key)
    ("doc_id", "<u8"),
    ("file_idx", "<u4"),
    ("line", "<u8"),
    ("token_start", "<u8"),  # element offset into the unit's .tokens file
    ("n_tokens", "<u4"),  # without EOS
    ("source_idx", "<u4"),  # index into the unit's source list
])


# ------------------------------------------------------------------------------------------------ chunks
class ChunkWriter:
    """Collect (line, bytes) records into a zstd-compressed chunk file."""

    def __init__(self, stream: BinaryIO, level: int = 1):
        self._stream = stream
        self._compressor = zstandard.ZstdCompressor(level=level).stream_writer(stream, closefd=False)
        self.records = 0
        self.raw_bytes = 0

    def add(self, line: int, data: bytes) -> None:
        self._compressor.write(_RECORD_HEADER.pack(line, len(data)))
        self._compressor.write(data)
        self.records += 1
        self.raw_bytes += len(data)

    def close(self) -> None:
        self._compressor.flush(zstandard.FLUSH_FRAME)
        self._compressor.close()


def iter_chunk(stream: BinaryIO) -> Iterator[tuple]:
    """Yield (line, bytes) from a chunk file written by ChunkWriter; a cut-short file is an IOError."""
    reader = zstandard.ZstdDecompressor().stream_reader(stream, read_across_frames=True)
    while True:
        header = _read_exact(reader, _RECORD_HEADER.size)
        if not header:
            return
        if len(header) != _RECORD_HEADER.size:
            raise IOError("spill chunk truncated inside a record header")
        line, length = _RECORD_HEADER.unpack(header)
        data = _read_exact(reader, length)
        if len(data) != length:
            raise IOError(f"spill chunk truncated: line {line} wants {length} bytes, got {len(data)}")
        yield line, data


def _read_exact(reader, n: int) -> bytes:
    parts = []
    got = 0
    while got < n:
        part = reader.read(n - got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


# ------------------------------------------------------------------------------------------------- units
def write_index(stream: BinaryIO, index: np.ndarray) -> None:
    stream.write(np.ascontiguousarray(index, dtype=INDEX_DTYPE).tobytes())


def read_index_range(stream: BinaryIO, n_records: int, lo: int, hi: int) -> np.ndarray:
    """Index records with lo <= key < hi, found by binary search with seeks (no full read)."""
    size = INDEX_DTYPE.itemsize

    def key_at(i: int) -> int:
        stream.seek(i * size)
        return struct.unpack("<Q", stream.read(8))[0]

    def lower_bound(target: int) -> int:
        a, b = 0, n_records
        while a < b:
            mid = (a + b) // 2
            if key_at(mid) < target:
                a = mid + 1
            else:
                b = mid
        return a

    first = lower_bound(lo)
    last = lower_bound(hi)
    if last <= first:
        return np.zeros(0, dtype=INDEX_DTYPE)
    stream.seek(first * size)
    return np.frombuffer(stream.read((last - first) * size), dtype=INDEX_DTYPE)


def read_index_rows(stream: BinaryIO, start: int, count: int) -> np.ndarray:
    """Index records [start, start + count) in one ranged read (the row offsets are known: no search)."""
    size = INDEX_DTYPE.itemsize
    stream.seek(start * size)
    data = stream.read(count * size)
    if len(data) != count * size:
        raise IOError(f"index spill truncated: wanted {count} records at {start}")
    return np.frombuffer(data, dtype=INDEX_DTYPE)


def read_token_range(stream: BinaryIO, dtype: np.dtype, start: int, count: int) -> np.ndarray:
    stream.seek(start * dtype.itemsize)
    data = stream.read(count * dtype.itemsize)
    if len(data) != count * dtype.itemsize:
        raise IOError(f"token spill truncated: wanted {count} tokens at {start}")
    return np.frombuffer(data, dtype=dtype)
