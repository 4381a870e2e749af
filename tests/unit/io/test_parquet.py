"""Parquet input: rows become documents like JSON lines do; bad rows and oversized row groups are dead letters."""
from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import stdlib_texts
from transforms.io.read_parquet import _row_record, iter_parquet_records
from transforms.io.read_records import FileDamage, RawRecord


def _texts(n_bytes=200_000):
    out = []
    for _name, text in stdlib_texts(n_bytes):
        out += [text[i:i + 1500] for i in range(0, len(text), 1500) if text[i:i + 1500].strip()]
    return out


def _write(path, table, row_group_size):
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def _pile_style(texts):
    """text + a struct column like the Pile's meta, + a column the job must not read."""
    sources = ["Alpha" if i % 3 else "Beta" for i in range(len(texts))]
    return pa.table({"text": texts, "meta": [{"pile_set_name": s} for s in sources],
                     "url": [f"https://example.org/{i}" for i in range(len(texts))]})


def _records(path, max_bytes=1 << 20, text="text", sources=("meta.pile_set_name",)):
    with open(path, "rb") as f:
        return list(iter_parquet_records(f, text, sources, max_bytes))


def test_rows_become_records_with_row_numbers(tmp_path):
    texts = _texts()[:130]
    path = _write(tmp_path / "a.parquet", _pile_style(texts), row_group_size=50)
    items = _records(path)
    assert [r.line for r in items] == list(range(1, 131)) and all(isinstance(r, RawRecord) for r in items)
    first = json.loads(items[0].data)
    assert first == {"text": texts[0], "meta": {"pile_set_name": "Beta"}}  # only the fields the job uses


def test_struct_fields_with_null_parents_and_batches(tmp_path):
    n = 2500  # more than one read batch per row group
    meta = [None if i % 7 == 0 else {"pile_set_name": f"S{i % 5}", "x": i} for i in range(n)]
    path = _write(tmp_path / "s.parquet", pa.table({"text": [f"t{i}" for i in range(n)], "meta": meta}), 2000)
    items = _records(path)
    got = [json.loads(i.data) for i in items]
    assert [g["text"] for g in got] == [f"t{i}" for i in range(n)]
    assert [g["meta"]["pile_set_name"] for g in got] == [None if m is None else m["pile_set_name"] for m in meta]


def test_bad_rows_name_file_row_group_and_row(tmp_path):
    table = pa.table({"content": ["good one", None, "good two", None], "source": ["s", "s", None, "s"]})
    items = _records(_write(tmp_path / "b.parquet", table, 2), text="content", sources=("source",))
    damage = [i for i in items if isinstance(i, FileDamage)]
    assert [(d.line, d.reason, d.detail) for d in damage] == [(2, "text_null", "row group 0, row 1"),
                                                              (4, "text_null", "row group 1, row 1")]
    ints = pa.table({"text": pa.array([1, 2], pa.int64())})
    items = _records(_write(tmp_path / "c.parquet", ints, 2), sources=())
    assert [i.reason for i in items] == ["text_not_a_string"] * 2
    binary = pa.table({"text": pa.array([b"ok \xc3\xa9", b"\xff\xfe bad"], pa.binary())})
    items = _records(_write(tmp_path / "d.parquet", binary, 2), sources=())
    assert isinstance(items[0], RawRecord) and json.loads(items[0].data)["text"] == "ok é"
    assert items[1].reason == "invalid_utf8"


def test_oversized_row_group_and_cell_and_corrupt_file_are_dead_letters(tmp_path):
    texts = _texts()[:120]
    path = _write(tmp_path / "big.parquet", _pile_style(texts), row_group_size=40)
    limit = max(len(t.encode()) for t in texts) * 2  # one document fits, a row group of 40 does not
    items = _records(path, max_bytes=limit)
    assert [(i.line, i.reason) for i in items] == [(1, "row_group_too_large"), (41, "row_group_too_large"),
                                                   (81, "row_group_too_large")]
    assert "row group 1: 40 rows" in items[1].detail
    with open(path, "rb") as f:  # the row group bound is its own knob: with room, every row is read
        assert all(isinstance(i, RawRecord) for i in iter_parquet_records(f, "text", (), limit, 100 * limit))
    # the row group bound implies the cell bound (pages are measured before compression); the guard stays
    row = _row_record({"text": "é" * 600}, "text", 7, 0, 6, max_bytes=1000)
    assert (row.reason, row.line) == ("cell_too_large", 7)
    assert row.detail == "row group 0, row 6: text longer than 1000 bytes"
    blob = (tmp_path / "big.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(blob[: len(blob) // 2])
    items = _records(tmp_path / "cut.parquet")
    assert len(items) == 1 and items[0].reason == "parquet_corrupt"
    assert _records(tmp_path / "cut.parquet") == list(iter_parquet_records(io.BytesIO(blob[: len(blob) // 2]),
                                                                           "text", (), 1 << 20))
