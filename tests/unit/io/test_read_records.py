"""The reader: every frame, every line, and every kind of damage reported instead of raised or hidden."""
import gzip
import io
import tracemalloc

import pytest
import zstandard

from transforms.io.decompress import OUTPUT_STEP
from transforms.io.read_records import FileDamage, RawRecord, compression_of, iter_raw_records

MiB = 1 << 20


def read_all(data: bytes, compression: str, **kw):
    return list(iter_raw_records(io.BytesIO(data), compression, **kw))


def test_reads_every_zstd_frame():
    cctx = zstandard.ZstdCompressor()
    data = cctx.compress(b"a\nb\n") + cctx.compress(b"c\n") + cctx.compress(b"d")
    items = read_all(data, "zstd")
    assert [(r.line, r.data) for r in items] == [(1, b"a"), (2, b"b"), (3, b"c"), (4, b"d")]


def test_truncated_zstd_keeps_complete_lines_and_reports_the_rest():
    # ~1.5 MB of poorly compressible lines: zstd emits output per 128 KiB block, so a cut keeps whole blocks
    text = b"".join(b'{"text": "line %d"}\n' % (i * 7919 % 1000003) for i in range(80000))
    blob = zstandard.ZstdCompressor().compress(text)
    items = read_all(blob[: len(blob) // 2], "zstd")
    records = [i for i in items if isinstance(i, RawRecord)]
    damage = [i for i in items if isinstance(i, FileDamage)]
    assert len(damage) == 1 and damage[0].reason == "zstd_truncated"
    assert damage[0].line == len(records) + 1
    assert all(r.data == b'{"text": "line %d"}' % ((r.line - 1) * 7919 % 1000003) for r in records)
    assert 0 < len(records) < 80000


@pytest.mark.parametrize("data,reason", [(b"", "zstd_empty_file"), (b'{"text": "plain"}\n', "zstd_corrupt")])
def test_empty_or_plain_text_zst(data, reason):
    items = read_all(data, "zstd")
    assert len(items) == 1 and isinstance(items[0], FileDamage) and items[0].reason == reason


def test_truncated_gzip():
    blob = gzip.compress(b"".join(b"line %d\n" % i for i in range(5000)))
    items = read_all(blob[: len(blob) // 2], "gzip")
    assert isinstance(items[-1], FileDamage) and items[-1].reason == "gzip_truncated"
    assert all(isinstance(i, RawRecord) for i in items[:-1])


def test_crlf_blank_and_missing_final_newline():
    items = read_all(b"a\r\n\r\nb\nlast", "none")
    assert [(r.line, r.data) for r in items] == [(1, b"a"), (2, b""), (3, b"b"), (4, b"last")]


def test_overlong_line_is_reported_and_reading_goes_on():
    data = b"short\n" + b"x" * 5000 + b"\nafter\n" + b"y" * 5000
    items = read_all(data, "none", max_line_bytes=1000)
    kinds = [(type(i).__name__, i.line) for i in items]
    assert kinds == [("RawRecord", 1), ("FileDamage", 2), ("RawRecord", 3), ("FileDamage", 4)]
    assert items[1].reason == "line_too_long" and items[1].excerpt.startswith("xxx")


def test_compression_of():
    assert compression_of("s3://b/00.jsonl.zst") == "zstd"
    assert compression_of("/x/c4.json.gz") == "gzip"
    assert compression_of("a.jsonl") == "none"


def test_spill_chunk_round_trip_and_truncation_is_an_error():
    from transforms.shard.spill import ChunkWriter, iter_chunk

    buf = io.BytesIO()
    writer = ChunkWriter(buf)
    records = [(1, b'{"text": "a"}'), (2, b""), (5, b"x" * 100_000)]
    for line, data in records:
        writer.add(line, data)
    writer.close()
    blob = buf.getvalue()
    assert list(iter_chunk(io.BytesIO(blob))) == records
    # cut inside the last record: the reader must raise, not yield a shorter list
    plain = b"".join(__import__("struct").pack("<QQ", line, len(d)) + d for line, d in records)
    cut = zstandard.ZstdCompressor().compress(plain[:-10])
    with pytest.raises(IOError):
        list(iter_chunk(io.BytesIO(cut)))


# ------------------------------------------------------------------------------ bounded memory
def zstd_stream(data: bytes, window_log: int = 0, chunk: int = 16 * MiB) -> bytes:
    """A streamed zstd frame (no content size in the header), as the `zstd` CLI writes from a pipe."""
    params = zstandard.ZstdCompressionParameters(window_log=window_log, write_content_size=False)
    buf = io.BytesIO()
    with zstandard.ZstdCompressor(compression_params=params).stream_writer(buf, closefd=False) as w:
        for i in range(0, len(data), chunk):
            w.write(data[i:i + chunk])
    return buf.getvalue()


def zstd_bomb(line_bytes: int, after: bytes = b"") -> bytes:
    """A few KB of zstd whose first line expands to line_bytes, built without holding it uncompressed."""
    buf = io.BytesIO()
    with zstandard.ZstdCompressor(level=3).stream_writer(buf, closefd=False) as w:
        piece = b"x" * (16 * MiB)
        for _ in range(line_bytes // len(piece)):
            w.write(piece)
        w.write(b"\n" + after)
    return buf.getvalue()


def peak_traced(fn):
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("compression", ["zstd", "gzip", "none"])
def test_overlong_line_is_skipped_streaming_not_held(compression):
    """A 64 MiB line with --max-line-mb 1: dead-lettered with file position and excerpt, and the reader never
    holds more than the limit plus a step (main held the whole decompressed block: 64 MiB and more)."""
    after = b'{"text": "after"}\n'
    if compression == "zstd":
        blob = zstd_bomb(64 * MiB, after)
    else:
        raw = b"x" * (64 * MiB) + b"\n" + after
        blob = gzip.compress(raw, compresslevel=1) if compression == "gzip" else raw
        del raw
    items, peak = peak_traced(lambda: [(type(i).__name__, i.line, getattr(i, "reason", None), getattr(i, "data", None))
                                        for i in iter_raw_records(io.BytesIO(blob), compression, max_line_bytes=MiB)])
    assert items == [("FileDamage", 1, "line_too_long", None), ("RawRecord", 2, None, b'{"text": "after"}')]
    assert peak < 2 * MiB + 3 * OUTPUT_STEP + (4 << 20), f"reader held {peak / MiB:.0f} MiB for a 1 MiB limit"


def test_line_at_the_limit_is_a_record_one_byte_more_is_not():
    data = b"a" * 1000 + b"\n" + b"b" * 1001 + b"\nc"
    for compression, blob in (("none", data), ("zstd", zstandard.ZstdCompressor().compress(data))):
        items = list(iter_raw_records(io.BytesIO(blob), compression, max_line_bytes=1000))
        assert [(type(i).__name__, i.line) for i in items] == [("RawRecord", 1), ("FileDamage", 2), ("RawRecord", 3)]
        assert items[1].excerpt == "b" * 160 and "--max-line-mb" in items[1].detail


@pytest.mark.parametrize("window_log", [27, 28, 29])
def test_long_window_files_within_the_limit_are_read(window_log):
    """`zstd --long=28/29` files are valid; main dead-lettered windows above zstd's default 2^27 whole."""
    lines = b"".join(b'{"text": "doc %d"}\n' % i for i in range(1000))
    items = list(iter_raw_records(io.BytesIO(zstd_stream(lines, window_log)), "zstd"))
    assert [i.data for i in items] == lines.splitlines()


def test_window_above_the_limit_is_a_dead_letter_naming_the_option():
    blob = zstd_stream(b'{"text": "a"}\n', window_log=30)
    items = list(iter_raw_records(io.BytesIO(blob), "zstd"))
    assert len(items) == 1 and items[0].reason == "zstd_window_too_large"
    assert "--max-zstd-window-mb" in items[0].detail and "1024" in items[0].detail
    ok = list(iter_raw_records(io.BytesIO(blob), "zstd", max_zstd_window_bytes=1 << 30))
    assert [i.data for i in ok] == [b'{"text": "a"}']


def test_frame_walker_damage_cases():
    cctx = zstandard.ZstdCompressor(write_checksum=True)
    good = cctx.compress(b"a\nb\n")
    skippable = (0x184D2A53).to_bytes(4, "little") + (5).to_bytes(4, "little") + b"12345"
    assert [i.data for i in read_all(skippable + good + skippable, "zstd")] == [b"a", b"b"]
    for cut in range(1, len(good)):  # every cut point: complete lines kept, then exactly one damage
        items = read_all(good + good[:cut], "zstd")
        assert [i.data for i in items[:2]] == [b"a", b"b"]
        assert [type(i).__name__ for i in items[2:]] == ["FileDamage"]
        assert items[2].reason in ("zstd_truncated", "zstd_corrupt"), (cut, items[2])
    tail = read_all(good + b"garbage", "zstd")
    assert [type(i).__name__ for i in tail] == ["RawRecord", "RawRecord", "FileDamage"]
    assert tail[-1].reason == "zstd_corrupt"
    flipped = bytearray(good)
    flipped[-1] ^= 0xFF  # content checksum
    assert read_all(bytes(flipped), "zstd")[-1].reason == "zstd_corrupt"


@pytest.mark.parametrize("compress,named,actual", [
    (lambda b: __import__("bz2").compress(b), "none", "bzip2"),
    (lambda b: __import__("lzma").compress(b), "none", "xz"),
    (gzip.compress, "zstd", "gzip"),
    (lambda b: zstandard.ZstdCompressor().compress(b), "gzip", "zstd"),
    (lambda b: zstandard.ZstdCompressor().compress(b), "none", "zstd")])
def test_bytes_that_contradict_the_name_are_one_dead_letter_not_garbage_lines(compress, named, actual):
    from transforms.io.read_records import compression_problem, sniff_compression

    blob = compress(b'{"text": "a"}\n' * 200)
    items = list(iter_raw_records(io.BytesIO(blob), named))
    assert len(items) == 1 and isinstance(items[0], FileDamage) and items[0].reason == "compression_mismatch"
    assert actual in items[0].detail and sniff_compression(blob[:6]) == actual
    suffix = {"none": ".jsonl", "zstd": ".jsonl.zst", "gzip": ".jsonl.gz"}[named]
    assert f"x{suffix}: named as" in compression_problem("x" + suffix, blob[:6])


def test_matching_compression_and_plain_text_read_as_before():
    from transforms.io.read_records import compression_problem

    text = b'{"text": "a"}\n{"text": "b"}'
    assert [i.data for i in iter_raw_records(io.BytesIO(text), "none")] == [b'{"text": "a"}', b'{"text": "b"}']
    assert [i.data for i in iter_raw_records(io.BytesIO(gzip.compress(text)), "gzip")][1] == b'{"text": "b"}'
    assert compression_problem("a.jsonl", text[:6]) is None and compression_problem("a.jsonl", b"") is None
    skippable = b"\x50\x2a\x4d\x18" + (4).to_bytes(4, "little") + b"meta" + zstandard.ZstdCompressor().compress(text)
    assert [i.data for i in iter_raw_records(io.BytesIO(skippable), "zstd")][0] == b'{"text": "a"}'
