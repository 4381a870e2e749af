"""Decompressing `.zst` and `.gz` streams (and passing plain ones through) with bounded output per step.

Memory is bounded by the limits, whatever the input: every decompressor hands out at most about `OUTPUT_STEP`
bytes per step, and the line scanner (transforms/io/read_records.py) applies `max_line_bytes` while it scans,
so an over-long line is never held whole. The reader holds at most about 2 x max_line_bytes + OUTPUT_STEP, even
for a few kilobytes of zstd that expand to gigabytes.

Why the zstd path walks the frame format itself: python-zstandard's `decompressobj` returns *all* the output of
the input it is given (1 MiB of crafted input can expand to 32 GiB), and its `stream_reader`, which bounds the
output, returns truncated or empty input without an error. Reading the frame and block headers (RFC 8878 §3)
gives both: each block decompresses to at most 128 KiB, so feeding one whole block per step bounds the
output, and a stream that ends inside a frame is seen as cut short. The header also tells the window a frame
needs before any memory is allocated for it, so a window above `--max-zstd-window-mb` is a dead letter that
names the option.
"""
from __future__ import annotations

import gzip
import zlib
from typing import BinaryIO, Iterator

import zstandard

READ_BLOCK = 1 << 20  # plain / compressed bytes read from the stream per step
OUTPUT_STEP = 1 << 20  # decompressed bytes handed to the line scanner per step (at most about this)
DEFAULT_MAX_ZSTD_WINDOW_BYTES = 512 << 20  # zstd's own default limit is 128 MiB; `zstd --long=31` needs 2 GiB
ZSTD_WINDOW_OPTION = "--max-zstd-window-mb"


class StreamDamage(Exception):
    """A damaged stream: `reason` is the dead letter's reason (zstd_truncated, gzip_corrupt, ...)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


# ------------------------------------------------------------------------------------------------- zstd
_ZSTD_MAGIC = 0xFD2FB528
_SKIPPABLE_MAGIC = 0x184D2A50  # low 4 bits free


class _Source:
    """Exact-size reads from a stream, with the count of bytes taken (for messages)."""

    def __init__(self, stream: BinaryIO):
        self._stream = stream
        self._buf = b""
        self._pos = 0
        self.offset = 0

    def take(self, n: int) -> bytes:
        """Exactly n bytes, or fewer only at the end of the stream."""
        if len(self._buf) - self._pos >= n:
            out = self._buf[self._pos:self._pos + n]
            self._pos += n
        else:
            parts = [self._buf[self._pos:]]
            have = len(parts[0])
            self._buf, self._pos = b"", 0
            while have < n:
                block = self._stream.read(max(READ_BLOCK, n - have))
                if not block:
                    break
                need = n - have
                if len(block) > need:
                    self._buf = block
                    self._pos = need
                    block = block[:need]
                parts.append(block)
                have += len(block)
            out = b"".join(parts)
        self.offset += len(out)
        return out

    def skip(self, n: int) -> int:
        """Drop n bytes without holding them; returns how many were there."""
        done = 0
        while done < n:
            got = len(self.take(min(READ_BLOCK, n - done)))
            if not got:
                break
            done += got
        return done


def _zstd_window(header: bytes, frame_no: int) -> tuple[int, int, bool]:
    """(window size, header length, has checksum) of a frame header; `header` holds at least 14 bytes or all."""
    fhd = header[4]
    fcs_flag, single, checksum, did_flag = fhd >> 6, (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3
    if fhd & 0x08:
        raise StreamDamage("zstd_corrupt", f"frame {frame_no}: reserved bit set in the frame header")
    pos = 5
    window = 0
    if not single:
        wd = header[pos]
        pos += 1
        base = 1 << (10 + (wd >> 3))
        window = base + (base >> 3) * (wd & 7)
    pos += (0, 1, 2, 4)[did_flag]
    fcs_size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if len(header) < pos + fcs_size:
        raise StreamDamage("zstd_truncated", f"stream ends inside the header of frame {frame_no} (file cut short)")
    if single:
        fcs = int.from_bytes(header[pos:pos + fcs_size], "little") + (256 if fcs_size == 2 else 0)
        window = max(fcs, 1 << 10)
    return window, pos + fcs_size, bool(checksum)


def _zstd_blocks(stream: BinaryIO, max_window_bytes: int = DEFAULT_MAX_ZSTD_WINDOW_BYTES) -> Iterator[bytes]:
    """Decompress every frame of a zstd stream, at most about OUTPUT_STEP bytes per yielded block; raise
    StreamDamage when it is empty, corrupt, cut short or needs a window above `max_window_bytes`."""
    dctx = zstandard.ZstdDecompressor(max_window_size=max_window_bytes)
    src = _Source(stream)
    frames = 0
    while True:
        start = src.offset
        magic_bytes = src.take(4)
        if not magic_bytes:
            break
        if len(magic_bytes) < 4:
            raise StreamDamage("zstd_truncated", f"stream ends inside the magic number of frame {frames + 1}")
        magic = int.from_bytes(magic_bytes, "little")
        if magic & 0xFFFFFFF0 == _SKIPPABLE_MAGIC:  # user metadata; no output
            size_bytes = src.take(4)
            size = int.from_bytes(size_bytes, "little")
            if len(size_bytes) < 4 or src.skip(size) < size:
                raise StreamDamage("zstd_truncated", f"stream ends inside skippable frame {frames + 1}")
            frames += 1
            continue
        if magic != _ZSTD_MAGIC:
            raise StreamDamage("zstd_corrupt", f"not a zstd frame at byte {start} (magic {magic_bytes.hex()}) "
                                                f"after {frames} complete frame(s)")
        yield from _zstd_frame(dctx, src, magic_bytes, frames + 1, max_window_bytes)
        frames += 1
    if frames == 0:
        raise StreamDamage("zstd_empty_file", "0-byte .zst file: no zstd frame at all")


def _zstd_frame(dctx, src: _Source, magic_bytes: bytes, frame_no: int, max_window_bytes: int) -> Iterator[bytes]:
    fhd = src.take(1)
    if not fhd:
        raise StreamDamage("zstd_truncated", f"stream ends inside the header of frame {frame_no} (file cut short)")
    rest_len = _header_rest_length(fhd[0])
    header = magic_bytes + fhd + src.take(rest_len)
    if len(header) < 5 + rest_len:
        raise StreamDamage("zstd_truncated", f"stream ends inside the header of frame {frame_no} (file cut short)")
    window, _, checksum = _zstd_window(header, frame_no)
    if window > max_window_bytes:
        raise StreamDamage(
            "zstd_window_too_large",
            f"frame {frame_no} needs a {window / (1 << 20):g} MiB decompression window, above "
            f"{ZSTD_WINDOW_OPTION} {max_window_bytes / (1 << 20):g}; raise {ZSTD_WINDOW_OPTION} to read this file "
            f"(the window is held in memory while it is read)")
    dobj = dctx.decompressobj()
    pending = [header]
    last = False
    while not last:
        block_header = src.take(3)
        if len(block_header) < 3:
            raise StreamDamage("zstd_truncated", f"zstd stream ends inside frame {frame_no} (file cut short)")
        value = int.from_bytes(block_header, "little")
        last, kind, size = bool(value & 1), (value >> 1) & 3, value >> 3
        if kind == 3:
            raise StreamDamage("zstd_corrupt", f"frame {frame_no}: reserved block type at byte {src.offset - 3}")
        payload = src.take(1 if kind == 1 else size)
        if len(payload) < (1 if kind == 1 else size):
            raise StreamDamage("zstd_truncated", f"zstd stream ends inside frame {frame_no} (file cut short)")
        pending.append(block_header)
        pending.append(payload)
        if last and checksum:
            digest = src.take(4)
            if len(digest) < 4:
                raise StreamDamage("zstd_truncated", f"zstd stream ends inside frame {frame_no}'s checksum")
            pending.append(digest)
        try:  # one block at a time: at most 128 KiB out, and every complete block counts before a cut
            out = dobj.decompress(b"".join(pending))
        except zstandard.ZstdError as e:
            raise StreamDamage("zstd_corrupt", f"zstd error in frame {frame_no}: {e}") from None
        pending = []
        if out:
            yield out
    if not dobj.eof:  # every block was fed: the decoder must have seen the frame end
        raise StreamDamage("zstd_corrupt", f"frame {frame_no} did not end after its last block")


def _header_rest_length(fhd: int) -> int:
    """Bytes of a frame header after the descriptor byte: window descriptor, dictionary id, content size."""
    single = (fhd >> 5) & 1
    return (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + (1 if single else 0, 2, 4, 8)[fhd >> 6]


# ------------------------------------------------------------------------------------------ gzip, plain
def _gzip_blocks(stream: BinaryIO) -> Iterator[bytes]:
    """GzipFile.read(n) returns at most n bytes (zlib's max_length), so the output per step is bounded."""
    gz = gzip.GzipFile(fileobj=stream, mode="rb")
    try:
        while True:
            block = gz.read(OUTPUT_STEP)
            if not block:
                return
            yield block
    except EOFError as e:
        raise StreamDamage("gzip_truncated", f"gzip stream cut short: {e}") from None
    except (gzip.BadGzipFile, zlib.error, OSError) as e:
        raise StreamDamage("gzip_corrupt", f"gzip error: {e}") from None


def _plain_blocks(stream: BinaryIO) -> Iterator[bytes]:
    while True:
        block = stream.read(READ_BLOCK)
        if not block:
            return
        yield block


def decompressed_blocks(stream: BinaryIO, compression: str,
                        max_zstd_window_bytes: int = DEFAULT_MAX_ZSTD_WINDOW_BYTES) -> Iterator[bytes]:
    """The decompressed bytes of a stream, about OUTPUT_STEP at a time; raises StreamDamage on damage."""
    if compression == "zstd":
        return _coalesced(_zstd_blocks(stream, max_zstd_window_bytes))
    return {"gzip": _gzip_blocks, "none": _plain_blocks}[compression](stream)


def _coalesced(blocks: Iterator[bytes]) -> Iterator[bytes]:
    """Join small pieces (zstd gives one per 128 KiB block) into about OUTPUT_STEP, for a faster line scan;
    what was decoded before a damage is still handed out before the damage is raised."""
    parts, size = [], 0
    try:
        for block in blocks:
            parts.append(block)
            size += len(block)
            if size >= OUTPUT_STEP:
                yield b"".join(parts)
                parts, size = [], 0
    except StreamDamage:
        if parts:
            yield b"".join(parts)
        raise
    if parts:
        yield b"".join(parts)
