"""Each document's source, for `pileprep export DIR --format megatron --by-source` (pipeline/tools/export_megatron.py).

The shards carry a document's id (`piece_doc_ids`) but not its source (adding it would change their bytes), so the
source comes from the inputs the dataset was made from: every file of the manifest's ledger is read again, its
sha256 first compared with the ledger's (a changed or missing input is refused by name: the sources would not be
the dataset's), each line parsed with the dataset's own settings (text field, source fields, line and zstd window
limits) by the shard job's own parser (transforms/shard/documents.py `parse_record`), and the document id mapped to
its source. A document id is a hash of the text alone, so one text under two sources is one id: the copy the shard
job kept is the first in (generation, path, line) order (transforms/shard/pack.py merges rows by key, then file
index, then line; a later generation's copy is an exact duplicate of the earlier one). The exporter then checks its
per-split, per-source document and token counts against the manifest's `sources` section, so a corner this rule
gets wrong (a `--val-input` copy that wins over an earlier train copy) is an error, never a wrong file.

Memory: two arrays over every distinct document id (u64 id, u16 source number): 10 bytes a document.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from model_contract.hashing import sha256_file
from transforms.io import io_utils

_PREFIX_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MAX_SOURCES = 1 << 16


class SourceError(ValueError):
    """The inputs cannot tell the documents' sources as the dataset has them."""


@dataclass
class DocumentSources:
    """Sorted document ids and each one's source number (`names[number]`)."""
    ids: np.ndarray  # u64, sorted, unique
    source: np.ndarray  # u16, parallel to ids
    names: list[str]

    def lookup(self, doc_ids: np.ndarray) -> np.ndarray:
        """Source numbers of `doc_ids`; SourceError when one is in no input."""
        doc_ids = np.asarray(doc_ids, dtype=np.uint64)
        at = np.searchsorted(self.ids, doc_ids)
        at_clipped = np.minimum(at, max(self.ids.size - 1, 0))
        found = (at < self.ids.size) & (self.ids[at_clipped] == doc_ids) if self.ids.size else np.zeros(
            doc_ids.size, dtype=bool)
        if not found.all():
            missing = int(doc_ids[np.flatnonzero(~found)[0]])
            raise SourceError(f"document {missing:x} is in no input of the ledger: the inputs are not the ones the "
                              f"dataset was made from")
        return self.source[at_clipped]


def _ledger_in_order(manifest) -> list:
    """Ledger rows in the order the shard job let copies win: generation (commit order), then path."""
    rows = list(manifest.ledger or [])
    order = {g.get("name"): i for i, g in enumerate(manifest.generations or [])}
    return sorted(rows, key=lambda r: (order.get(r.generation, len(order)), r.path))


def document_sources(manifest) -> DocumentSources:
    """Read the ledger's inputs again (module doc). SourceError names a changed or missing input."""
    from transforms.io.read_records import RawRecord, compression_of, iter_raw_records  # noqa: PLC0415
    from transforms.shard.documents import Document, parse_record  # noqa: PLC0415

    config = manifest.config or {}
    text_field = config.get("text_field", "text")
    source_fields = tuple(config.get("source_fields") or ("meta.pile_set_name",))
    max_line = int(float(config.get("max_line_mb", 56.0)) * (1 << 20))
    max_window = int(float(config.get("max_zstd_window_mb", 512.0)) * (1 << 20))
    rows = _ledger_in_order(manifest)
    if not rows:
        raise SourceError("the manifest has no ledger (a dataset from before inputs were recorded): its sources "
                          "cannot be read back")
    names: dict = {}
    id_parts, source_parts = [], []
    for row in rows:
        if not io_utils.exists(row.path):
            raise SourceError(f"input {row.path} is gone: --by-source reads the dataset's inputs again")
        if row.sha256 is not None:
            _size, sha = sha256_file(row.path, opener=io_utils.open_read)
            if sha != row.sha256:
                raise SourceError(f"input {row.path} changed since the dataset was made (sha256 {sha[:12]}, the "
                                  f"ledger has {row.sha256[:12]}): --by-source needs the inputs as they were")
        ids, sources = [], []
        with io_utils.open_read(row.path) as stream:
            for item in iter_raw_records(stream, compression_of(row.path), max_line, max_window):
                if not isinstance(item, RawRecord):
                    continue
                doc = parse_record(item.data, text_field, source_fields)
                if isinstance(doc, Document):
                    ids.append(doc.doc_id)
                    sources.append(names.setdefault(doc.source, len(names)))
        if len(names) > MAX_SOURCES:
            raise SourceError(f"more than {MAX_SOURCES} sources: not a mixture Megatron can blend")
        id_parts.append(np.array(ids, dtype=np.uint64))
        source_parts.append(np.array(sources, dtype=np.uint16))
    all_ids = np.concatenate(id_parts)
    all_sources = np.concatenate(source_parts)
    order = np.argsort(all_ids, kind="stable")  # among equal ids, the first read wins
    ids = all_ids[order]
    first = np.ones(ids.size, dtype=bool)
    first[1:] = ids[1:] != ids[:-1]
    return DocumentSources(ids[first], all_sources[order][first], sorted(names, key=names.get))


def prefix_names(sources: list) -> dict:
    """{source: file-name part}: Megatron's blend is a space-separated list of weights and paths, so a prefix
    holds only [A-Za-z0-9._-] ("Wikipedia (en)" -> "Wikipedia_en"); two sources that would share one get the
    source's position in sorted order appended."""
    parts = {s: (_PREFIX_UNSAFE.sub("_", s).strip("_.") or "source") for s in sorted(sources)}
    counts: dict = {}
    for p in parts.values():
        counts[p] = counts.get(p, 0) + 1
    return {s: (p if counts[p] == 1 else f"{p}_{i}") for i, (s, p) in enumerate(sorted(parts.items()))}


def blend(prefixes: list, tokens: list) -> list:
    """Megatron's blend list [weight, prefix, weight, prefix, ...]: each source's share of the split's tokens as
    written (its mixture as the dataset holds it, `--source-weights` copies included), to 8 decimals. Megatron
    normalises the weights (megatron/core/datasets/utils.py `get_blend_from_list`, `normalize`)."""
    total = sum(tokens)
    out: list = []
    for prefix, n in zip(prefixes, tokens):
        if n:
            out += [f"{n / total:.8f}", prefix]
    return out
