"""Reading raw records (file, line number, bytes) out of `.jsonl`, `.jsonl.zst` and `.jsonl.gz` streams.

Pure streaming functions over binary file objects; Beam's FileSystems (local, EFS/FSx paths, s3://) opens the
files in the wiring around them. Damage is reported, never raised.

The decompressors, which bound the output per step whatever the input, are transforms/io/decompress.py; the
line scanner here applies `max_line_bytes` while it scans, so an over-long line is never held whole (its head is
kept for the excerpt, the rest skipped as it streams by).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Iterator, Union

from transforms.io.decompress import DEFAULT_MAX_ZSTD_WINDOW_BYTES, StreamDamage, decompressed_blocks

# Long documents tokenize in exact pieces (transforms/tokenize/long_documents.py); a worst-case document at the
# limit (CJK or astral characters with byte fallback, ~16.5 bytes of peak RSS per byte measured on 50 MB) stays
# within the 1.5 GB per-worker bound. Longer lines are dead-lettered `line_too_long`.
DEFAULT_MAX_LINE_BYTES = 64 << 20
LINE_OPTION = "--max-line-mb"
EXCERPT_CHARS = 160
_EXCERPT_BYTES = EXCERPT_CHARS * 4


@dataclass(frozen=True)
class RawRecord:
    line: int  # 1-based line number in the decompressed file
    data: bytes  # the line without its terminator ("\n" or "\r\n")


@dataclass(frozen=True)
class FileDamage:
    """Unreadable input: the rest of a file (stream damage) or one over-long line; one dead letter at `line`."""
    line: int
    reason: str  # zstd_truncated | zstd_corrupt | zstd_empty_file | zstd_window_too_large | gzip_truncated |
    #              gzip_corrupt | line_too_long | compression_mismatch
    detail: str
    excerpt: str = ""


ReadItem = Union[RawRecord, FileDamage]


def compression_of(path: str) -> str:
    name = path.lower()
    if name.endswith(".zst") or name.endswith(".zstd"):
        return "zstd"
    if name.endswith(".gz"):
        return "gzip"
    return "none"


# What the first bytes say, whatever the name (each format's own magic number). Only zstd, gzip and plain text
# are read; the others are recognised so that they are refused by name instead of read as text.
MAGIC_BYTES = 6
_MAGICS = (("zstd", b"\x28\xb5\x2f\xfd"), ("gzip", b"\x1f\x8b"), ("bzip2", b"BZh"),
           ("xz", b"\xfd7zXZ\x00"), ("lz4", b"\x04\x22\x4d\x18"), ("zip", b"PK\x03\x04"),
           ("7z", b"7z\xbc\xaf\x27\x1c"), ("lzma", b"\x5d\x00\x00"))


def sniff_compression(head: bytes) -> str:
    """The format the leading bytes announce: one of the names in `_MAGICS`, or "none" (plain or unknown)."""
    if len(head) >= 4 and head[1:4] == b"\x2a\x4d\x18" and head[0] & 0xF0 == 0x50:
        return "zstd"  # a zstd skippable frame (magic 0x184D2A5?) may open a zstd file
    for name, magic in _MAGICS:
        if head.startswith(magic):
            return name
    return "none"


def compression_problem(path: str, head: bytes):
    """None when `head` (the first MAGIC_BYTES of the file) is what `compression_of(path)` will read it as; else
    a message naming the file, the format its name claims and the format its bytes are."""
    claimed, actual = compression_of(path), sniff_compression(head)
    if claimed == actual or actual == "none":
        # Bytes of no known format are damage for the named reader to report (an empty or plain-text `.zst` is
        # one zstd_empty_file / zstd_corrupt dead letter); only a *different* known format is a wrong name.
        return None
    said = {"none": "plain text"}.get(claimed, claimed)
    return f"{path}: named as {said} but its bytes are {actual}"


def excerpt_of(data: bytes, limit: int = EXCERPT_CHARS) -> str:
    return bytes(data[:limit * 4]).decode("utf-8", errors="replace")[:limit]


def _head(pieces: list, extra: bytes = b"") -> bytes:
    """The first _EXCERPT_BYTES of pieces + extra, without joining all of them."""
    out, size = [], 0
    for piece in (*pieces, extra):
        if size >= _EXCERPT_BYTES:
            break
        out.append(piece[:_EXCERPT_BYTES - size])
        size += len(out[-1])
    return b"".join(out)


def _too_long(line: int, max_line_bytes: int, head: bytes) -> FileDamage:
    return FileDamage(line, "line_too_long",
                      f"line longer than {LINE_OPTION} {max_line_bytes / (1 << 20):g} ({max_line_bytes} bytes); "
                      f"skipped to its newline", excerpt_of(head))


class _Prefixed:
    """A stream with bytes already read from it put back in front."""

    def __init__(self, head: bytes, stream: BinaryIO):
        self.head, self.stream = head, stream

    def read(self, n: int = -1) -> bytes:
        if self.head:
            if n is None or n < 0:
                out, self.head = self.head + self.stream.read(), b""
                return out
            out, self.head = self.head[:n], self.head[n:]
            if len(out) < n:
                out += self.stream.read(n - len(out))
            return out
        return self.stream.read(n)


def iter_raw_records(stream: BinaryIO, compression: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
                     max_zstd_window_bytes: int = DEFAULT_MAX_ZSTD_WINDOW_BYTES) -> Iterator[ReadItem]:
    """Yield a RawRecord per line and a FileDamage for anything unreadable; never raises on bad data.

    Lines end at "\\n" ("\\r\\n" is stripped too); a last line without a newline is still a record. A line
    longer than max_line_bytes is one `line_too_long` damage (its first bytes as excerpt) and reading goes on
    after its newline. When the stream is damaged, the incomplete line in progress is part of the damage
    record, not a record of its own.
    """
    head = stream.read(MAGIC_BYTES)
    actual = sniff_compression(head)
    # One dead letter for the file, not one per line of binary read as text (see compression_problem).
    if actual not in (compression, "none"):
        yield FileDamage(1, "compression_mismatch", f"read as {compression} (its name) but its bytes are {actual}")
        return
    stream = _Prefixed(head, stream)
    line_no = 0
    pending: list = []  # pieces of the current line, together at most max_line_bytes
    pending_len = 0
    skipping = None  # the head of an over-long line while the rest of it streams by, else None
    try:
        for block in decompressed_blocks(stream, compression, max_zstd_window_bytes):
            start = 0
            size = len(block)
            while start <= size:
                nl = block.find(b"\n", start)
                end = size if nl < 0 else nl
                if skipping is None and end > start:
                    if pending_len + (end - start) > max_line_bytes:
                        skipping = _head(pending, block[start:start + _EXCERPT_BYTES])
                        pending, pending_len = [], 0
                    else:
                        pending.append(block[start:end])
                        pending_len += end - start
                if nl < 0:
                    break
                start = nl + 1
                line_no += 1
                if skipping is not None:
                    yield _too_long(line_no, max_line_bytes, skipping)
                    skipping = None
                    continue
                data = b"".join(pending) if len(pending) != 1 else pending[0]
                pending, pending_len = [], 0
                yield RawRecord(line_no, data[:-1] if data.endswith(b"\r") else data)
    except StreamDamage as damage:
        head = skipping if skipping is not None else _head(pending)
        yield FileDamage(line_no + 1, damage.reason, damage.detail, excerpt_of(head) if head else "")
        return
    if skipping is not None:
        yield _too_long(line_no + 1, max_line_bytes, skipping)
    elif pending:
        data = b"".join(pending)
        yield RawRecord(line_no + 1, data[:-1] if data.endswith(b"\r") else data)
