"""Reading Parquet inputs (FineWeb, DCLM, many HF datasets) as the same (line, bytes) records as JSON lines.

Each row becomes one record whose bytes are a small JSON object holding only the fields the job uses (the
text field and the source fields, dotted paths into struct columns), so everything downstream — parse,
validate, dedup, tokenize, dead letters — is the JSON-lines path unchanged. The record's `line` is the row's
1-based number in the file; dead letters raised here also name the row group and the row inside it.

Memory is bounded like every reader's (transforms/io/read_records.py): only the needed columns are read, one row
group at a time, in batches of `BATCH_ROWS`; a row group whose needed columns would decompress to more than
`max_row_group_bytes` is not read at all but dead-lettered (one record, `row_group_too_large`), and a text larger
than `max_bytes` (the longest document allowed, like a JSON line) is dead-lettered as `cell_too_large`. A file
whose footer cannot be read is one `parquet_corrupt` dead letter; a row group that fails to decode is one
`parquet_corrupt` dead letter and reading continues with the next.
"""
from __future__ import annotations

import json
from typing import BinaryIO, Iterator, Sequence

from transforms.io.read_records import FileDamage, RawRecord, excerpt_of
from transforms.shard.documents import lookup_field

BATCH_ROWS = 1024
PARQUET_SUFFIXES = (".parquet", ".parq")


def is_parquet(path: str) -> bool:
    return path.lower().endswith(PARQUET_SUFFIXES)


def _get(row: dict, dotted: str):
    return lookup_field(row, dotted, _MISSING)


class _Missing:
    pass


_MISSING = _Missing()


def _put(obj: dict, dotted: str, value) -> None:
    parts = dotted.split(".")
    for part in parts[:-1]:
        obj = obj.setdefault(part, {})
    obj[parts[-1]] = value


def _record_bytes(row: dict) -> bytes:
    # ASCII escapes: json's C encoder does those ~10x faster than ensure_ascii=False's, and json.loads undoes them.
    return json.dumps(row, default=str).encode("ascii")


def _needed_columns(schema_names: list, fields: Sequence[str]) -> list:
    tops = {f.split(".", 1)[0] for f in fields}
    return [n for n in schema_names if n in tops]


def iter_parquet_records(stream: BinaryIO, text_field: str, source_fields: Sequence[str], max_bytes: int,
                         max_row_group_bytes: int | None = None) -> Iterator:
    """Yield RawRecord per row (JSON bytes of the used fields) and FileDamage for what cannot be read."""
    import pyarrow as pa  # noqa: PLC0415 - only Parquet inputs need pyarrow on the worker
    import pyarrow.parquet as pq  # noqa: PLC0415

    fields = (text_field, *source_fields)
    max_row_group_bytes = max(max_bytes, max_row_group_bytes or 0)
    try:
        pf = pq.ParquetFile(stream)
        meta = pf.metadata
        columns = _needed_columns(pf.schema_arrow.names, fields)
    except (pa.ArrowException, OSError, ValueError) as e:
        yield FileDamage(1, "parquet_corrupt", f"cannot read the Parquet footer: {e}")
        return
    first_row = 0
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        need = sum(rg.column(i).total_uncompressed_size for i in range(rg.num_columns)
                   if rg.column(i).path_in_schema.split(".", 1)[0] in columns)
        line0 = first_row + 1
        first_row += rg.num_rows
        if need > max_row_group_bytes:
            yield FileDamage(line0, "row_group_too_large",
                             f"row group {g}: {rg.num_rows} rows, {need} bytes of needed columns uncompressed "
                             f"> limit {max_row_group_bytes} (rows {line0}..{first_row} not read)")
            continue
        r = 0
        try:
            for batch in _row_group_batches(pf, g, columns):
                for row in _rows(batch, fields):
                    yield _row_record(row, text_field, line0 + r, g, r, max_bytes)
                    r += 1
        except (pa.ArrowException, OSError, ValueError) as e:
            yield FileDamage(line0 + r, "parquet_corrupt",
                             f"row group {g} from row {r} (rows {line0 + r}..{first_row} not read): {e}")


def _leaf(batch, dotted: str):
    """The values at a dotted path as a Python list (struct fields pulled out column-wise), or None if absent."""
    import pyarrow as pa  # noqa: PLC0415

    parts = dotted.split(".")
    if parts[0] not in batch.schema.names:
        return None
    arr = batch.column(parts[0])
    for part in parts[1:]:
        if not pa.types.is_struct(arr.type) or arr.type.get_field_index(part) < 0:
            return None
        arr = arr.flatten()[arr.type.get_field_index(part)]  # flatten(): offsets and null parents applied
    return arr.to_pylist()


def _rows(batch, fields: Sequence[str]) -> Iterator[dict]:
    """Rows as nested dicts of the used fields only: converting a few columns is much cheaper than to_pylist()."""
    columns = [(name, _leaf(batch, name)) for name in dict.fromkeys(fields)]
    present = [(name, values) for name, values in columns if values is not None]
    for i in range(batch.num_rows):
        row: dict = {}
        for name, values in present:
            _put(row, name, values[i])
        yield row


def _row_group_batches(pf, g: int, columns: list):
    return pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[g], columns=columns or None, use_threads=False)


def _row_record(row: dict, text_field: str, line: int, group: int, in_group: int, max_bytes: int):
    where = f"row group {group}, row {in_group}"
    text = _get(row, text_field)
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError:
            return FileDamage(line, "invalid_utf8", where, excerpt_of(bytes(text)))
        _put(row, text_field, text)
    if text is _MISSING:
        return FileDamage(line, "text_missing", f"{where}: no column {text_field!r}", "")
    if text is None:
        return FileDamage(line, "text_null", where, "")
    if not isinstance(text, str):
        return FileDamage(line, "text_not_a_string", f"{where}: {type(text).__name__}", excerpt_of(
            str(text).encode("utf-8")))
    if len(text) > max_bytes or (4 * len(text) > max_bytes and len(text.encode("utf-8")) > max_bytes):
        return FileDamage(line, "cell_too_large", f"{where}: text longer than {max_bytes} bytes",
                          excerpt_of(text[:200].encode("utf-8")))
    return RawRecord(line, _record_bytes(row))
