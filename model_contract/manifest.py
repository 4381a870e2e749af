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
from model_contract.contract import ContractError, DataContract

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "pileprep.manifest"


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
    extra: dict = field(default_factory=dict)  # room for later sections (generations, retrieval, ...)

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
        d.update(self.extra)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict) -> "Manifest":
        if d.get("format") != MANIFEST_FORMAT:
            raise ContractError(f"not a pileprep manifest (format={d.get('format')!r})")
        known = {"format", "pileprep_version", "contract", "shards", "splits", "sources", "padding_fraction",
                 "records", "inputs", "dead_letters", "config"}
        return cls(
            contract=DataContract.from_dict(d["contract"]),
            shards=[ShardInfo.from_dict(s) for s in d["shards"]],
            splits=d.get("splits", {}),
            sources=d.get("sources", {}),
            padding_fraction=d.get("padding_fraction", 0.0),
            records=d.get("records", {}),
            inputs=d.get("inputs", []),
            dead_letters=d.get("dead_letters", []),
            config=d.get("config", {}),
            pileprep_version=d.get("pileprep_version", ""),
            extra={k: v for k, v in d.items() if k not in known},
        )

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ContractError(f"manifest is not valid JSON: {e}") from None
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


def resolve_shard_path(manifest_file: str, shard: ShardInfo) -> str:
    """Absolute location of a shard, given where its manifest lives."""
    base = posixpath.dirname(manifest_file) if "://" in manifest_file else os.path.dirname(manifest_file)
    return _join(base, shard.path)
