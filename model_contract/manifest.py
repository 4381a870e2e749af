"""The manifest: the one file that describes (and, written last, commits) a sharded dataset.

Paths inside are relative to the manifest's own directory, so a dataset can be moved or mounted elsewhere
(EFS, FSx, S3) without rewriting it. Serialization is canonical (sorted keys, fixed indentation) so the same
run gives byte-identical manifests.
"""
from __future__ import annotations

import json
import os
import posixpath
import re
from dataclasses import dataclass, field
from typing import Optional

from model_contract.contract import ContractError, DataContract

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "pileprep.manifest"
# The only form a generation directory's name takes (pipeline/config.py `fingerprint`): `gen-` + 16 hex digits.
# Names are read back from the manifest to decide what to delete, so anything else is refused, never resolved.
GENERATION_PATTERN = re.compile(r"gen-[0-9a-f]{16}")
GENERATION_FIELDS = ("name", "inputs", "shards", "examples", "tokens", "documents")


def is_generation_name(name) -> bool:
    return isinstance(name, str) and GENERATION_PATTERN.fullmatch(name) is not None


def check_generation_name(name, what: str = "generation") -> str:
    """`name` if it is a generation directory name of the exact generated form, else ContractError."""
    if not is_generation_name(name):
        raise ContractError(f"manifest {what} {name!r} is not a generation name (gen-<16 hex digits>); refusing a "
                            "damaged or hand-edited manifest")
    return name


def check_relative_path(rel, what: str = "path") -> str:
    """`rel` if it is a relative path that stays inside the dataset directory, else ContractError.

    Manifest paths are relative to the manifest (module doc); an absolute path, a `..` component, an empty
    component, a backslash or a URL would let a damaged manifest point readers (or deletions) elsewhere.
    """
    ok = isinstance(rel, str) and rel and "\\" not in rel and "://" not in rel and "\x00" not in rel
    parts = rel.split("/") if ok else []
    if not ok or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or re.match(r"[A-Za-z]:", rel):
        raise ContractError(f"manifest {what} {rel!r} is not a relative path inside the dataset directory; refusing "
                            "a damaged or hand-edited manifest")
    return rel


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
    def from_dict(cls, d: dict) -> "ShardInfo":
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
    ledger: Optional[list] = None  # None: a manifest that predates the ledger (synthesized from `inputs`)
    skipped_inputs: list = field(default_factory=list)  # glob matches that were not files: {path, reason}
    extra: dict = field(default_factory=dict)  # room for later sections (retrieval, ...)

    def shards_for(self, split: str) -> list:
        return [s for s in self.shards if s.split == split]

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
            d["ledger"] = self.ledger
        if self.skipped_inputs:
            d["skipped_inputs"] = self.skipped_inputs
        d.update({k: v for k, v in self.extra.items() if k not in d})
        return d

    def validate(self) -> "Manifest":
        """Refuse a manifest whose state could steer reads or deletions outside the dataset (ContractError)."""
        for i, s in enumerate(self.shards):
            check_relative_path(s.path, f"shards[{i}].path")
        for i, rel in enumerate(self.dead_letters):
            check_relative_path(rel, f"dead_letters[{i}]")
        if self.generation is not None:
            check_generation_name(self.generation, "generation")
        if not isinstance(self.generations, list):
            raise ContractError("manifest generations must be a list")
        for i, g in enumerate(self.generations):
            if not isinstance(g, dict):
                raise ContractError(f"manifest generations[{i}] must be an object, got {g!r}")
            check_generation_name(g.get("name"), f"generations[{i}].name")
            for k in GENERATION_FIELDS[1:]:
                if k in g and (not isinstance(g[k], int) or isinstance(g[k], bool) or g[k] < 0):
                    raise ContractError(f"manifest generations[{i}].{k} must be a count, got {g[k]!r}")
        if self.ledger is not None:
            if not isinstance(self.ledger, list):
                raise ContractError("manifest ledger must be a list")
            for i, row in enumerate(self.ledger):
                if not isinstance(row, dict) or not isinstance(row.get("path"), str):
                    raise ContractError(f"manifest ledger[{i}] must be an object with a path, got {row!r}")
                size = row.get("bytes")
                if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
                    raise ContractError(f"manifest ledger[{i}].bytes must be a size, got {size!r}")
                check_generation_name(row.get("generation"), f"ledger[{i}].generation")
        return self

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict) -> "Manifest":
        if d.get("format") != MANIFEST_FORMAT:
            raise ContractError(f"not a pileprep manifest (format={d.get('format')!r})")
        known = {"format", "pileprep_version", "contract", "shards", "splits", "sources", "padding_fraction",
                 "records", "inputs", "dead_letters", "config", "generation", "generations", "ledger", "skipped_inputs"}
        try:
            shards = [ShardInfo.from_dict(s) for s in d["shards"]]
        except (KeyError, TypeError) as e:
            raise ContractError(f"manifest shards are damaged ({type(e).__name__}: {e})") from None
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
            ledger=d.get("ledger"),
            skipped_inputs=d.get("skipped_inputs", []),
            extra={k: v for k, v in d.items() if k not in known},
        ).validate()

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ContractError(f"manifest is not valid JSON: {e}") from None
        if not isinstance(d, dict):
            raise ContractError("manifest is not a JSON object")
        return cls.from_dict(d)


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
