"""The manifest: the one file that describes (and, written last, commits) a sharded dataset.

Paths inside are relative to the manifest's own directory, so a dataset can be moved or mounted elsewhere
(EFS, FSx, S3) without rewriting it (model_contract/dataset_paths.py resolves them). Serialization is canonical
(sorted keys, fixed indentation) so the same run gives byte-identical manifests. Its rows are typed records
(model_contract/manifest_rows.py), checked on load by model_contract/manifest_check.py.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from model_contract.contract import ContractError, DataContract
from model_contract.dataset_paths import MANIFEST_NAME
from model_contract.manifest_check import MANIFEST_FORMAT, check_manifest_dict
from model_contract.manifest_rows import (SECTIONS, BandIndexRow, FileDigest, GenerationRow, IdIndexRow, LedgerRow,
                                          ShardInfo, section_json)
from model_contract.retrieval import SidecarInfo


@dataclass
class Manifest:
    contract: DataContract
    shards: list[ShardInfo]
    # split -> {documents, tokens, examples, shards, padding_tokens}
    splits: dict[str, dict[str, int]] = field(default_factory=dict)
    # source -> split -> {documents, tokens}
    sources: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    padding_fraction: float = 0.0
    # the `records` JSON (RecordCounts.to_dict): {read, written, filtered: {reason: n}, dead_lettered: {...}}
    records: dict[str, Any] = field(default_factory=dict)
    # the `inputs` JSON rows (InputFileStats.to_dict), one per input file: path, bytes, read, written, filtered,
    # dead_lettered
    inputs: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[str] = field(default_factory=list)  # dead-letter files, relative paths
    config: dict[str, Any] = field(default_factory=dict)  # the `config` JSON (ShardConfig.to_manifest_dict)
    pileprep_version: str = ""
    # The committed dataset's state (pipeline/shard/integrity.py): the newest generation, one row per generation
    # in commit order ({name, inputs, shards, examples, tokens, documents}), one ledger row per input file held
    # ({path, bytes, generation[, mtime, etag, sha256]}). Validated on load: they decide what a run deletes.
    generation: Optional[str] = None
    generations: list[dict[str, Any]] = field(default_factory=list)  # the `generations` JSON rows (GenerationRow)
    ledger: Optional[list[LedgerRow]] = None  # None: a manifest that predates the ledger (synthesized from `inputs`)
    # glob matches that were not files: {path, reason} (pipeline/ops/guards.py skipped_inputs)
    skipped_inputs: list[dict[str, str]] = field(default_factory=list)
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
    dead_letter_files: Optional[list[FileDigest]] = None
    doc_id_indexes: Optional[list[IdIndexRow]] = None
    duplicates_by_source: Optional[dict[str, int]] = None  # source of the removed copy -> exact duplicates removed
    band_indexes: Optional[list[BandIndexRow]] = None
    retrieval: Optional[SidecarInfo] = None
    # Every other key, kept as its JSON value and written back unchanged: the report's sections (`statistics`,
    # `mixture`, `near_dedup`, `tokenizer_backend`) and sections this reader does not know.
    extra: dict[str, Any] = field(default_factory=dict)

    def shards_for(self, split: str) -> list:
        return [s for s in self.shards if s.split == split]

    def generation_rows(self) -> list:
        """The `generations` rows as checked `GenerationRow`s, in commit order: public API for a consumer of a
        dataset (a trainer or notebook importing model_contract, not pileprep) asking which generations it holds
        and each one's totals; pileprep's own commands keep the JSON rows (`generations`)."""
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
                d[key] = section_json(value)
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


def load_manifest(path_or_dir: str) -> Manifest:
    """Read a manifest from a local path or a dataset directory (the trainer's side)."""
    path = path_or_dir if path_or_dir.endswith(".json") else os.path.join(path_or_dir, MANIFEST_NAME)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no manifest at {path}: the dataset is missing or was never committed")
    with open(path, encoding="utf-8") as f:
        return Manifest.from_json(f.read())
