"""Reading raw records (file, line number, bytes) out of `.jsonl`, `.jsonl.zst` and `.jsonl.gz` streams.

Pure streaming functions over binary file objects; Beam's FileSystems (local, EFS/FSx paths, s3://) opens the
files in the wiring around them. Damage is reported, never raised: python-zstandard hands back truncated or
empty output *without* an error, so the zstd path feeds frames one at a time and checks that the last frame
really ended. Memory is bounded by `max_line_bytes`, not by file size.
"""
from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Iterator, Union

import zstandard

READ_BLOCK = 1 << 20
DEFAULT_MAX_LINE_BYTES = 256 << 20  # a 50 MB document fits; a runaway line without newlines does not
EXCERPT_CHARS = 160


@dataclass(frozen=True)
class RawRecord:
    line: int  # 1-based line number in the decompressed file
    data: bytes  # the line without its terminator ("\n" or "\r\n")


@dataclass(frozen=True)
class FileDamage:
    """The rest of a file could not be read; counts as one dead-lettered record at `line`."""
    line: int
    reason: str  # zstd_truncated | zstd_corrupt | zstd_empty_file | gzip_truncated | gzip_corrupt | line_too_long
    detail: str
    excerpt: str = ""


ReadItem = Union[RawRecord, FileDamage]


class _StreamDamage(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def compression_of(path: str) -> str:
    name = path.lower()
    if name.endswith(".zst") or name.endswith(".zstd"):
        return "zstd"
    if name.endswith(".gz"):
        return "gzip"
    return "none"


def _zstd_blocks(stream: BinaryIO) -> Iterator[bytes]:
    """Decompress every frame of a zstd stream; raise _StreamDamage when it is empty, corrupt or cut short."""
    dctx = zstandard.ZstdDecompressor()
    dobj = dctx.decompressobj()
    fed_current_frame = False
    frames = 0
    while True:
        block = stream.read(READ_BLOCK)
        if not block:
            break
        while block:
            try:
                out = dobj.decompress(block)
            except zstandard.ZstdError as e:
                raise _StreamDamage("zstd_corrupt", f"zstd error after {frames} complete frame(s): {e}") from None
            fed_current_frame = True
            if out:
                yield out
            if dobj.eof:
                frames += 1
                block = dobj.unused_data
                dobj = dctx.decompressobj()
                fed_current_frame = False
            else:
                block = b""
    if frames == 0 and not fed_current_frame:
        raise _StreamDamage("zstd_empty_file", "0-byte .zst file: no zstd frame at all")
    if fed_current_frame:
        raise _StreamDamage("zstd_truncated", f"zstd stream ends inside frame {frames + 1} (file cut short)")


def _gzip_blocks(stream: BinaryIO) -> Iterator[bytes]:
    gz = gzip.GzipFile(fileobj=stream, mode="rb")
    try:
        while True:
            block = gz.read(READ_BLOCK)
            if not block:
                return
            yield block
    except EOFError as e:
        raise _StreamDamage("gzip_truncated", f"gzip stream cut short: {e}") from None
    except (gzip.BadGzipFile, zlib.error, OSError) as e:
        raise _StreamDamage("gzip_corrupt", f"gzip error: {e}") from None


def _plain_blocks(stream: BinaryIO) -> Iterator[bytes]:
    while True:
        block = stream.read(READ_BLOCK)
        if not block:
            return
        yield block


def decompressed_blocks(stream: BinaryIO, compression: str) -> Iterator[bytes]:
    return {"zstd": _zstd_blocks, "gzip": _gzip_blocks, "none": _plain_blocks}[compression](stream)


def excerpt_of(data: bytes, limit: int = EXCERPT_CHARS) -> str:
    return data[:limit * 4].decode("utf-8", errors="replace")[:limit]


def iter_raw_records(stream: BinaryIO, compression: str,
                     max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Iterator[ReadItem]:
    """Yield a RawRecord per line and a FileDamage for anything unreadable; never raises on bad data.

    Lines end at "\\n" ("\\r\\n" is stripped too); a last line without a newline is still a record. When the
    stream is damaged, the incomplete line in progress is part of the damage record, not a record of its own.
    """
    line_no = 0
    pending: list[bytes] = []  # pieces of the current line
    pending_len = 0
    skipping = False  # inside an over-long line: drop bytes until its newline
    try:
        for block in decompressed_blocks(stream, compression):
            start = 0
            while True:
                nl = block.find(b"\n", start)
                if nl < 0:
                    rest = block[start:]
                    if rest and not skipping:
                        pending.append(rest)
                        pending_len += len(rest)
                        if pending_len > max_line_bytes:
                            skipping = True
                            head = b"".join(pending)[:EXCERPT_CHARS * 4]
                            pending, pending_len = [head], len(head)
                    break
                piece = block[start:nl]
                start = nl + 1
                line_no += 1
                if not skipping and pending_len + len(piece) > max_line_bytes:
                    skipping = True
                    pending = [(b"".join(pending) + piece[:EXCERPT_CHARS * 4])[:EXCERPT_CHARS * 4]]
                if skipping:
                    yield FileDamage(line_no, "line_too_long",
                                     f"line longer than max_line_bytes={max_line_bytes}", excerpt_of(pending[0]))
                    skipping = False
                    pending, pending_len = [], 0
                    continue
                if pending:
                    pending.append(piece)
                    data = b"".join(pending)
                    pending, pending_len = [], 0
                else:
                    data = piece
                if data.endswith(b"\r"):
                    data = data[:-1]
                yield RawRecord(line_no, data)
    except _StreamDamage as damage:
        yield FileDamage(line_no + 1, damage.reason, damage.detail,
                         excerpt_of(b"".join(pending)) if pending else "")
        return
    if pending or skipping:
        line_no += 1
        if skipping:
            yield FileDamage(line_no, "line_too_long", f"line longer than max_line_bytes={max_line_bytes}",
                             excerpt_of(pending[0]))
        else:
            data = b"".join(pending)
            yield RawRecord(line_no, data[:-1] if data.endswith(b"\r") else data)
