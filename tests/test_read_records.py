"""The reader: every frame, every line, and every kind of damage reported instead of raised or hidden."""
import gzip
import io

import pytest
import zstandard

from transforms.read_records import FileDamage, RawRecord, compression_of, iter_raw_records


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
    from transforms.spill import ChunkWriter, iter_chunk

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
