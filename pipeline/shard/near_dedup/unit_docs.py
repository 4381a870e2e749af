"""A unit's distinct documents as the near-dedup stage sees them: from its index rows, with their text (read
again from the unit's staged chunk), their token ids (from the tokenize stage's spill) or the signatures the
tokenize stage staged for them. The tokenize stage's files are named in transforms/shard/layout.py."""
from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from pipeline.shard.near_dedup.elements import DocRef
from transforms.io import io_utils
from transforms.shard import doc_ids, layout, tokenize_unit
from transforms.shard.documents import SPLIT_SHIFT, Document, parse_record
from transforms.shard.near_dedup import minhash
from transforms.shard.spill import INDEX_DTYPE, iter_chunk, read_index_rows


class UnitDocument(NamedTuple):
    line: int
    doc_id: int
    split: int
    source: str
    content: object  # its text (str) or its token ids (an int array)


def _staged(plan, placed: layout.Placed) -> str:
    return layout.Layout(plan.staging_dir, plan.data_dir).path(placed)


def distinct_rows(plan, unit) -> np.ndarray:
    """Index rows of a unit's distinct documents, in line order: per id the copy in the highest split (exact
    dedup keeps that one), the first line among equals. Exact copies of committed documents take no part (the
    packers drop them as duplicates). The one rule every way of signing a unit follows."""
    if unit.n_docs == 0:
        return np.zeros(0, dtype=INDEX_DTYPE)
    with io_utils.open_read(unit.index_path) as f:
        rows = read_index_rows(f, 0, unit.n_docs)
    held = np.zeros(rows.size, dtype=bool)
    for path in getattr(plan, "committed_id_indexes", ()):
        held |= doc_ids.IdIndex(path).contains(rows["doc_id"])
    rows = rows[~held]
    rows = rows[np.argsort(rows["line"], kind="stable")]
    best: dict = {}
    for i, (doc_id, split) in enumerate(zip(rows["doc_id"].tolist(),
                                            (rows["key"] >> np.uint64(SPLIT_SHIFT)).tolist())):
        cur = best.get(doc_id)
        if cur is None or split > cur[0]:
            best[doc_id] = (split, i)
    return rows[np.sort(np.array([i for _split, i in best.values()], dtype=np.int64))]


def _row_fields(unit, r) -> tuple:
    """(line, doc_id, split, source) of one index row."""
    return (int(r["line"]), int(r["doc_id"]), int(r["key"] >> np.uint64(SPLIT_SHIFT)),
            unit.sources[int(r["source_idx"])])


def staged_signatures(plan, unit, num_perm: int) -> Optional[tuple]:
    """([DocRef], signatures) of a unit's distinct documents (`distinct_rows`), in line order, from the
    signatures its tokenize stage staged (settings.tokenize_signing): the same documents and values as signing
    their text here. None when the file is missing or does not hold one row per indexed document (a unit
    staged by a run that signed nothing): the caller then reads the text."""
    path = _staged(plan, layout.unit_signatures(unit.name))
    dtype = tokenize_unit.unit_signatures_dtype(num_perm)
    if unit.n_docs == 0:
        return [], np.zeros((0, num_perm), dtype=minhash.SIGNATURE_DTYPE)
    if not io_utils.exists(path):
        return None
    data = io_utils.read_bytes(path)
    if len(data) != unit.n_docs * dtype.itemsize:
        return None
    staged = np.frombuffer(data, dtype=dtype)
    by_line = np.argsort(staged["line"], kind="stable")
    lines = staged["line"][by_line]
    chosen = [_row_fields(unit, r) for r in distinct_rows(plan, unit)]
    want = np.array([c[0] for c in chosen], dtype=np.uint64)
    at = np.minimum(np.searchsorted(lines, want), max(lines.size - 1, 0))
    if lines.size == 0 or not np.array_equal(lines[at], want):
        raise IOError(f"{unit.name}: staged near-dedup signatures do not match its index (staging damaged)")
    sigs = staged["sig"][by_line[at]]
    return [DocRef(doc_id, split, source, (unit.name, line)) for line, doc_id, split, source in chosen], sigs


def unit_documents(plan, unit, text: bool = True) -> list:
    """[UnitDocument] of each distinct document of a unit (`distinct_rows`), in line order, with its text.
    `text=False`: the document's token ids from the tokenize stage's spill (transforms/shard/spill.py layout),
    not its text: no second read and parse of the unit's chunk (--near-dedup-shingles tokens; --decontaminate
    still reads the text)."""
    rows = distinct_rows(plan, unit)
    if not rows.size:
        return []
    if not text:
        tokens = np.frombuffer(io_utils.read_bytes(unit.tokens_path), dtype=np.dtype(unit.token_dtype))
        return [UnitDocument(*_row_fields(unit, r),
                             tokens[int(r["token_start"]):int(r["token_start"]) + int(r["n_tokens"])])
                for r in rows]
    by_line = {line: (doc_id, split) for line, doc_id, split, _source in (_row_fields(unit, r) for r in rows)}
    cfg = plan.config
    out = []
    with io_utils.open_read(_staged(plan, layout.chunk_file(unit.name))) as f:
        for line, data in iter_chunk(f):
            if line not in by_line:
                continue
            doc = parse_record(data, cfg.text_field, tuple(cfg.source_fields))
            doc_id, split = by_line[line]
            if not isinstance(doc, Document) or doc.doc_id != doc_id:
                raise IOError(f"{unit.name}: line {line} does not hold document {doc_id} (staging damaged)")
            out.append(UnitDocument(line, doc_id, split, doc.source, doc.text))
    return out


def text_at(plan, loc) -> str:
    """The text of the document at `loc` (unit name, line, ...); "" for a committed one (no text is kept)."""
    if len(loc) < 2:
        return ""
    unit_name, line = loc[0], loc[1]
    cfg = plan.config
    with io_utils.open_read(_staged(plan, layout.chunk_file(unit_name))) as f:
        for ln, data in iter_chunk(f):
            if ln == line:
                doc = parse_record(data, cfg.text_field, tuple(cfg.source_fields))
                return doc.text if isinstance(doc, Document) else ""
    return ""
