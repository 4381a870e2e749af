"""The manifest: the one file that describes (and, written last, commits) a sharded dataset.

Paths inside are relative to the manifest's own directory, so a dataset can be moved or mounted elsewhere
(EFS, FSx, S3) without rewriting it. Serialization is canonical (sorted keys, fixed indentation) so the same
run gives byte-identical manifests.
"""
from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass, field
from typing import Optional

from model_contract.contract import ContractError, DataContract
from model_contract.retrieval import SidecarInfo
# check_generation_name / check_relative_path / is_generation_name live in model_contract/schema.py (the
# retrieval records use them too); readers of manifests import them from here as well.
from model_contract.schema import Fields, check_generation_name, check_relative_path, is_generation_name  # noqa: F401

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "pileprep.manifest"
GENERATION_FIELDS = ("name", "inputs", "shards", "examples", "tokens", "documents")
# commit_seq stays below 2^53: every JSON reader (a double in JavaScript, an int64 in Arrow, Parquet or Go) holds it
# exactly, and a forged 10^23 can neither outrank every real commit nor push the next one past int64
# (docs/wip/hostile-review-issue28.md F5).
COMMIT_SEQ_LIMIT = 2 ** 53


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


@dataclass
class Manifest:
    contract: DataContract
    shards: list  # [ShardInfo]
    splits: dict = field(default_factory=dict)  # split -> {documents, tokens, examples, shards, padding_tokens}
    sources: dict = field(default_factory=dict)  # source -> split -> {documents, tokens}
    padding_fraction: float = 0.0
    records: dict = field(default_factory=dict)  # {read, written, filtered: {reason: n}, dead_lettered: {...}}
    inputs: list = field(default_factory=list)  # per input file: path, read, written, filtered, dead_lettered
    dead_letters: list = field(default_factory=list)  # dead-letter files, relative paths
    config: dict = field(default_factory=dict)
    pileprep_version: str = ""
    # The committed dataset's state (pipeline/shard/integrity.py): the newest generation, one row per generation
    # in commit order ({name, inputs, shards, examples, tokens, documents}), one ledger row per input file held
    # ({path, bytes, generation[, mtime, etag, sha256]}). Validated on load: they decide what a run deletes.
    generation: Optional[str] = None
    generations: list = field(default_factory=list)
    ledger: Optional[list] = None  # [LedgerRow]; None: a manifest that predates the ledger (synthesized from `inputs`)
    skipped_inputs: list = field(default_factory=list)  # glob matches that were not files: {path, reason}
    # The commit's place in the output's history (1, 2, ...: one more than any commit the output kept), set by the
    # commit (pipeline/ops/commit.py): pruning and `pileprep gc` order generations by it, never by file mtimes,
    # which a copy, a sync or a `touch` rewrites. None: a manifest written before it was recorded.
    commit_seq: Optional[int] = None
    # The generation that was live when this one was committed (None: the output's first commit), set by the same
    # commit with `commit_seq` and written exactly when `previous_generation_recorded` (a manifest from before the
    # field has no key; a first commit writes null). It chains the copies, so a swap of two copies' valid
    # commit_seq values contradicts it and is refused (pipeline/ops/generations.py check_chain). A generation name,
    # no time: the manifest stays byte-identical across equal runs.
    previous_generation: Optional[str] = None
    previous_generation_recorded: bool = False
    # The sections besides the core, each None when absent from the JSON (see `SECTIONS`): what the manifest
    # commits (pipeline/ops/commit.py), the shard job's integrity sections (pipeline/shard/integrity.py), the
    # near-dedup band indexes (pipeline/shard/near_dedup/) and a neighbours sidecar's `retrieval`.
    kind: Optional[str] = None  # "dataset" | "sidecar"
    dead_letter_files: Optional[list] = None  # [FileDigest]
    doc_id_indexes: Optional[list] = None  # [IdIndexRow]
    duplicates_by_source: Optional[dict] = None  # source of the removed copy -> exact duplicates removed
    band_indexes: Optional[list] = None  # [BandIndexRow]
    retrieval: Optional[SidecarInfo] = None
    # Every other key, kept as its JSON value and written back unchanged: the report's sections (`statistics`,
    # `mixture`, `near_dedup`, `tokenizer_backend`) and sections this reader does not know.
    extra: dict = field(default_factory=dict)

    def shards_for(self, split: str) -> list:
        return [s for s in self.shards if s.split == split]

    def generation_rows(self) -> list:
        return [GenerationRow.from_dict(g, f"generations[{i}]") for i, g in enumerate(self.generations)]

    def to_dict(self) -> dict:
        d = {
            "format": MANIFEST_FORMAT,
            "pileprep_version": self.pileprep_version,
            "contract": self.contract.to_dict(),
            "shards": [s.to_dict() for s in self.shards],
            "splits": self.splits,
            "sources": self.sources,
            "padding_fraction": self.padding_fraction,
            "records": self.records,
            "inputs": self.inputs,
            "dead_letters": self.dead_letters,
            "config": self.config,
        }
        if self.generation is not None:
            d["generation"] = self.generation
        if self.generations:
            d["generations"] = self.generations
        if self.ledger is not None:
            d["ledger"] = [r.to_dict() for r in self.ledger]
        if self.skipped_inputs:
            d["skipped_inputs"] = self.skipped_inputs
        if self.commit_seq is not None:
            d["commit_seq"] = self.commit_seq
        if self.previous_generation_recorded:
            d["previous_generation"] = self.previous_generation
        for key, attr, _read in SECTIONS:
            value = getattr(self, attr)
            if value is not None:
                d[key] = _section_json(value)
        d.update({k: v for k, v in self.extra.items() if k not in d})
        return d

    def validate(self) -> "Manifest":
        """Refuse a manifest with any field of the wrong type or range (ContractError naming the field path):
        its paths and generation names steer reads and deletions, its counts are checked and reported."""
        check_manifest_dict(self.to_dict())
        return self

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict) -> "Manifest":
        if d.get("format") != MANIFEST_FORMAT:
            raise ContractError(f"not a pileprep manifest (format={d.get('format')!r})")
        check_manifest_dict(d)
        known = {"format", "pileprep_version", "contract", "shards", "splits", "sources", "padding_fraction",
                 "records", "inputs", "dead_letters", "config", "generation", "generations", "ledger", "skipped_inputs",
                 "commit_seq", "previous_generation", *(key for key, _attr, _read in SECTIONS)}
        shards = [ShardInfo.from_dict(s) for s in d["shards"]]
        ledger = d.get("ledger")
        return cls(
            contract=DataContract.from_dict(d["contract"]),
            shards=shards,
            splits=d.get("splits", {}),
            sources=d.get("sources", {}),
            padding_fraction=d.get("padding_fraction", 0.0),
            records=d.get("records", {}),
            inputs=d.get("inputs", []),
            dead_letters=d.get("dead_letters", []),
            config=d.get("config", {}),
            pileprep_version=d.get("pileprep_version", ""),
            generation=d.get("generation"),
            generations=d.get("generations", []),
            ledger=None if ledger is None else [LedgerRow.from_dict(r, f"ledger[{i}]") for i, r in enumerate(ledger)],
            skipped_inputs=d.get("skipped_inputs", []),
            commit_seq=d.get("commit_seq"),
            previous_generation=d.get("previous_generation"),
            previous_generation_recorded="previous_generation" in d,
            **{attr: read(d[key], key) for key, attr, read in SECTIONS if key in d},
            extra={k: v for k, v in d.items() if k not in known},
        )

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ContractError(f"manifest is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise ContractError("manifest is not a JSON object")
        return cls.from_dict(d)


# ------------------------------------------------------------------------------------------ typed records
# The manifest's sections as records: `Manifest` holds the ledger and the sections in `SECTIONS` as these
# (`inputs`, `generations`, `skipped_inputs` stay JSON rows, checked on load by the same records). Each
# record's `from_dict` checks one row against its schema, naming the field path, and `to_dict` writes the
# same JSON back (optional fields absent when unset, as the job writes them).
@dataclass(frozen=True)
class RecordCounts:
    """`records` (whole dataset) and each `inputs` row: read = written + filtered + dead-lettered."""
    read: int = 0
    written: int = 0
    filtered: dict = field(default_factory=dict)  # reason -> count
    dead_lettered: dict = field(default_factory=dict)  # reason -> count

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


def _section_json(value):
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


def check_contract_dict(d, prefix: str = "contract") -> None:
    """The contract's fields as the trainer sizes its model from them: types first (DataContract.from_dict
    converts with int(), so `seq_len: "512"` would pass it unnoticed)."""
    f = Fields(d, prefix)
    f.string("version")
    f.positive("seq_len")
    t = f.obj("tokenizer")
    t.string("kind")
    t.sha256("model_sha256")
    t.positive("vocab_size")
    for name in ("bos_id", "eos_id", "pad_id", "unk_id"):
        t.integer(name)
    for path, feature in f.items("features"):
        g = Fields(feature, path)
        g.string("name")
        g.string("dtype")
        for _path, dim in g.items("shape"):
            if dim is not None and not (isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0):
                g.fail("shape", "a list of sizes (integers >= 0, or null)", dim)
        g.string("description", required=False)
    if d.get("retrieval") is not None:
        r = f.obj("retrieval")
        for name in ("chunk_len", "num_neighbours", "neighbour_len"):
            r.positive(name)
        r.string("fingerprint", required=False)
        r.string("token_dtype", required=False)


def check_manifest_dict(d) -> None:
    """Every field of a (dataset or sidecar) manifest against its schema; ContractError naming the first bad
    field path, e.g. `manifest shards[3].sha256: expected a 64-hex string, got 12`."""
    f = Fields(d, "")
    if d.get("format") != MANIFEST_FORMAT:
        raise ContractError(f"not a pileprep manifest (format={d.get('format')!r})")
    f.string("pileprep_version", required=False)
    f.obj("contract")  # present and an object; then its fields
    check_contract_dict(d["contract"], "contract")
    for path, row in f.items("shards"):
        ShardInfo.from_dict(row, path)
    for split, totals in f.obj("splits", required=False).d.items():
        g = Fields(totals, f"splits.{split}")
        for k in totals:
            g.count(k)
    for source, per_split in f.obj("sources", required=False).d.items():
        g = Fields(per_split, f"sources.{source}")
        for split in per_split:
            g.counts(split)
    f.number("padding_fraction", required=False, lo=0, hi=1)
    RecordCounts.from_dict(d.get("records", {}), "records")
    for path, row in f.items("inputs", required=False):
        InputFileStats.from_dict(row, path)
    for path, rel in f.items("dead_letters", required=False):
        check_relative_path(rel, path)
    f.obj("config", required=False)
    if d.get("generation") is not None:
        check_generation_name(d["generation"], "generation")
    for path, row in f.items("generations", required=False):
        GenerationRow.from_dict(row, path)
    if d.get("ledger") is not None:
        for path, row in f.items("ledger"):
            LedgerRow.from_dict(row, path)
    for path, row in f.items("skipped_inputs", required=False):
        SkippedInput.from_dict(row, path)
    if "commit_seq" in d:  # absent: written before it was recorded; never null (no pileprep writes that)
        check_commit_seq(d["commit_seq"])
    if d.get("previous_generation") is not None:  # null: the output's first commit; absent: before the field
        check_generation_name(d["previous_generation"], "previous_generation")  # itself: refused by check_chain
    for key, _attr, read in SECTIONS:
        if key in d:
            read(d[key], key)
    for key in EXTRA_OBJECTS:
        if key in d:
            f.obj(key)


def check_commit_seq(value, where: str = "manifest commit_seq"):
    """`value` when it is a commit sequence number (an integer, 1 <= value < 2^53; not a bool, a float or a
    string), else a ContractError naming `where`. Pruning and `pileprep gc` order generations by it
    (pipeline/ops/generations.py): the live manifest and every generation manifest are held to this one rule."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < COMMIT_SEQ_LIMIT:
        shown = repr(value)
        raise ContractError(f"{where}: expected an integer >= 1 and < 2^53, got "
                            f"{shown if len(shown) <= 40 else shown[:37] + '...'}")
    return value


def _join(base: str, rel: str) -> str:
    return posixpath.join(base, rel) if "://" in base else os.path.join(base, rel)


def manifest_path(dataset_dir: str) -> str:
    return _join(dataset_dir.rstrip("/") if "://" in dataset_dir else dataset_dir, MANIFEST_NAME)


def load_manifest(path_or_dir: str) -> Manifest:
    """Read a manifest from a local path or a dataset directory (the trainer's side)."""
    path = path_or_dir if path_or_dir.endswith(".json") else os.path.join(path_or_dir, MANIFEST_NAME)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no manifest at {path}: the dataset is missing or was never committed")
    with open(path, encoding="utf-8") as f:
        return Manifest.from_json(f.read())


def resolve_dataset_path(manifest_file: str, rel: str, what: str = "path") -> str:
    """Location of a manifest-relative path, refused (ContractError naming `what`) unless it stays inside the
    manifest's directory. The one resolver: the trainer, `inspect`, `verify` and the shard job's commit use it."""
    check_relative_path(rel, what)
    base = posixpath.dirname(manifest_file) if "://" in manifest_file else os.path.dirname(manifest_file)
    return _join(base, rel)


def dataset_relative_path(path: str, dataset_dir: str) -> str:
    """The manifest-relative form of `path`, a file the job wrote under `dataset_dir` (the inverse of
    `resolve_dataset_path`; the result is checked the same way, so a path outside the dataset is refused)."""
    if "://" in dataset_dir:
        base = dataset_dir.rstrip("/") + "/"
        rel = path[len(base):] if path.startswith(base) else path
    else:
        rel = posixpath.relpath(path.replace("\\", "/"), dataset_dir.replace("\\", "/"))
    return check_relative_path(rel, "path")


def resolve_shard_path(manifest_file: str, shard) -> str:
    """Location of a shard (a ShardInfo or its relative path), given where its manifest lives."""
    rel = shard.path if isinstance(shard, ShardInfo) else shard
    return resolve_dataset_path(manifest_file, rel, "shard path")
