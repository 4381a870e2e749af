"""The manifest's rows as typed records (model_contract/manifest.py holds them in `Manifest`): its shards, record
counts, ledger and generation rows, and the typed sections in `SECTIONS`. Each record's `from_dict` checks one row
against its schema, naming the field path (model_contract/schema.py `Fields`), and `to_dict` writes the same JSON
back (optional fields absent when unset, as the job writes them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from model_contract.retrieval import SidecarInfo
from model_contract.schema import Fields, check_generation_name, check_relative_path

GENERATION_FIELDS = ("name", "inputs", "shards", "examples", "tokens", "documents")


@dataclass(frozen=True)
class ShardInfo:
    path: str  # relative to the manifest's directory
    split: str
    examples: int
    tokens: int  # non-padding tokens
    padding_tokens: int
    documents: int  # document pieces that start in this shard (a document's first piece)
    bytes: int
    sha256: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict, prefix: str = "shard") -> "ShardInfo":
        f = Fields(d, prefix)
        check_relative_path(f.string("path"), f.path("path"))
        f.string("split")
        for name in ("examples", "tokens", "padding_tokens", "documents", "bytes"):
            f.count(name)
        f.sha256("sha256")
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


# `Manifest` holds the ledger and the sections in `SECTIONS` as these records; `inputs`, `generations` and
# `skipped_inputs` stay JSON rows, checked on load by the same records (model_contract/manifest_check.py).
@dataclass(frozen=True)
class RecordCounts:
    """`records` (whole dataset) and each `inputs` row: read = written + filtered + dead-lettered."""
    read: int = 0
    written: int = 0
    filtered: dict[str, int] = field(default_factory=dict)  # reason -> count
    dead_lettered: dict[str, int] = field(default_factory=dict)  # reason -> count

    def to_dict(self) -> dict:
        return {"read": self.read, "written": self.written, "filtered": dict(self.filtered),
                "dead_lettered": dict(self.dead_lettered)}

    @classmethod
    def from_dict(cls, d: dict, prefix: str = "records") -> "RecordCounts":
        f = Fields(d, prefix)
        return cls(read=f.count("read", required=False) or 0, written=f.count("written", required=False) or 0,
                   filtered=f.counts("filtered", required=False),
                   dead_lettered=f.counts("dead_lettered", required=False))


@dataclass(frozen=True)
class InputFileStats:
    """One `inputs` row: an input file of this dataset with its record counts."""
    path: str
    bytes: Optional[int]
    counts: RecordCounts

    def to_dict(self) -> dict:
        return {"path": self.path, "bytes": self.bytes, **self.counts.to_dict()}

    @classmethod
    def from_dict(cls, d: dict, prefix: str = "inputs[0]") -> "InputFileStats":
        f = Fields(d, prefix)
        return cls(path=f.string("path"), bytes=f.count("bytes", required=False, nullable=True),
                   counts=RecordCounts.from_dict(d, prefix))


@dataclass(frozen=True)
class LedgerRow:
    """One `ledger` row: an input file the dataset holds and the generation that ingested it
    (pipeline/ops/incremental.py compares these with the current listing)."""
    path: str
    bytes: Optional[int]
    generation: str
    mtime: Optional[float] = None
    etag: Optional[str] = None
    sha256: Optional[str] = None

    def to_dict(self) -> dict:
        d = {"path": self.path, "bytes": self.bytes, "generation": self.generation}
        d.update({k: v for k, v in (("mtime", self.mtime), ("etag", self.etag), ("sha256", self.sha256))
                  if v is not None})
        return d

    @classmethod
    def from_dict(cls, d: dict, prefix: str = "ledger[0]") -> "LedgerRow":
        f = Fields(d, prefix)
        path = f.string("path")
        size = f.count("bytes", required=False, nullable=True)
        generation = check_generation_name(d.get("generation"), f.path("generation"))
        f.number("mtime", required=False)
        f.string("etag", required=False)
        f.sha256("sha256", required=False)
        return cls(path=path, bytes=size, generation=generation, mtime=d.get("mtime"), etag=d.get("etag"),
                   sha256=d.get("sha256"))


@dataclass(frozen=True)
class GenerationRow:
    """One `generations` row, in commit order, with the generation's totals."""
    name: str
    inputs: int = 0
    shards: int = 0
    examples: int = 0
    tokens: int = 0
    documents: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict, prefix: str = "generations[0]") -> "GenerationRow":
        f = Fields(d, prefix)
        name = check_generation_name(d.get("name"), f.path("name"))
        counts = {k: f.count(k, required=False) for k in GENERATION_FIELDS[1:]}
        return cls(name=name, **{k: v for k, v in counts.items() if v is not None})


@dataclass(frozen=True)
class FileDigest:
    """A file the manifest names besides shards (`dead_letter_files` rows): size and sha256 for `verify`."""
    path: str
    bytes: int
    sha256: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict, prefix: str) -> "FileDigest":
        f = Fields(d, prefix)
        check_relative_path(f.string("path"), f.path("path"))
        return cls(path=d["path"], bytes=f.count("bytes"), sha256=f.sha256("sha256"))


@dataclass(frozen=True)
class IdIndexRow:
    """A `doc_id_indexes` row: one generation's sorted document-id index (transforms/shard/doc_ids.py)."""
    generation: str
    path: str
    documents: int
    bytes: int
    sha256: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict, prefix: str) -> "IdIndexRow":
        f, generation, digest = _generation_file(d, prefix)
        return cls(generation=generation, path=digest.path, documents=f.count("documents"), bytes=digest.bytes,
                   sha256=digest.sha256)


def _generation_file(d: dict, prefix: str) -> tuple:
    """(Fields, generation, FileDigest) of a row naming one file of a generation, both checked."""
    f = Fields(d, prefix)
    digest = FileDigest.from_dict({k: d.get(k) for k in ("path", "bytes", "sha256")}, prefix)
    return f, check_generation_name(d.get("generation"), f.path("generation")), digest


@dataclass(frozen=True)
class BandIndexRow:
    """A `near_dedup_band_indexes` row: one key range of a generation's near-dedup band index
    (pipeline/shard/near_dedup/committed.py checks it against the dataset before an incremental run reads it)."""
    generation: str
    range: int
    path: str
    bytes: int
    sha256: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict, prefix: str) -> "BandIndexRow":
        f, generation, digest = _generation_file(d, prefix)
        return cls(generation=generation, range=f.count("range"), path=digest.path, bytes=digest.bytes,
                   sha256=digest.sha256)


@dataclass(frozen=True)
class SkippedInput:
    """A `skipped_inputs` row: a glob match that was not read (a directory, a dangling link) and why."""
    path: str
    reason: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict, prefix: str) -> "SkippedInput":
        f = Fields(d, prefix)
        return cls(path=f.string("path"), reason=f.string("reason"))


def _rows(record):
    """Reader of a section that is a list of `record` rows, each checked and named by its path."""
    def read(value, key: str) -> list:
        return [record.from_dict(row, path) for path, row in Fields({key: value}, "").items(key)]
    return read


def _counts(value, key: str) -> dict:
    return Fields({key: value}, "").counts(key)


def _string(value, key: str) -> str:
    return Fields({key: value}, "").string(key)


def section_json(value):
    """A typed section as JSON: a record's or a list of records' `to_dict`; counts and strings as they are."""
    if isinstance(value, list):
        return [r.to_dict() for r in value]
    return value.to_dict() if hasattr(value, "to_dict") else value


# The typed sections besides the core: (JSON key, Manifest attribute, reader checking and converting the value).
SECTIONS = (
    ("kind", "kind", _string),
    ("dead_letter_files", "dead_letter_files", _rows(FileDigest)),
    ("doc_id_indexes", "doc_id_indexes", _rows(IdIndexRow)),
    ("duplicates_by_source", "duplicates_by_source", _counts),
    ("near_dedup_band_indexes", "band_indexes", _rows(BandIndexRow)),
    ("retrieval", "retrieval", lambda value, key: SidecarInfo.from_dict(value, key)),
)
# Sections kept as JSON objects in `extra` (the report reads them), checked to be objects on load.
# `packing` (pipeline/shard/manifest_builder.py) is there only when the packing is not the default concat.
EXTRA_OBJECTS = ("statistics", "mixture", "tokenizer_backend", "near_dedup", "packing")
