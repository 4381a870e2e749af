"""Records the shard job's driver, stages and commit hand each other (dataclasses, not tuples and tagged dicts).

- `LedgerEntry`: one input file of the job's plan (path, size), in the plan's `ledger` order: the index of a file
  there is the `file_idx` every stage carries.
- `InputFile`: one input file as listed (path, bytes, mtime / ETag) and, once the split stage has read it,
  the sha256 of its bytes. Its `to_dict` is the listing row pipeline/ops/incremental.py diffs against the
  ledger (a `model_contract.manifest.LedgerRow` without the generation).
- `SplitOutput`: what the split stage hands on for one input file.
- `CommitParts`: every stage's results gathered for the commit, sorted by their type.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from transforms.shard import stages


@dataclass(frozen=True)
class LedgerEntry:
    """An input file the plan ingests: its path and size as listed (the generation's identity hashes these)."""
    path: str
    size: int


@dataclass(frozen=True)
class InputFile:
    path: str
    bytes: int
    mtime: Optional[float] = None  # local files: the change check after size (pipeline/ops/incremental.py)
    etag: Optional[str] = None  # object stores
    sha256: Optional[str] = None  # of the bytes the split stage read

    def to_dict(self) -> dict:
        d = {"path": self.path, "bytes": self.bytes}
        d.update({k: v for k, v in (("mtime", self.mtime), ("etag", self.etag), ("sha256", self.sha256))
                  if v is not None})
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "InputFile":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass(frozen=True)
class SplitOutput:
    """What the split stage hands on for one input file: its chunks and what was read of it (for the ledger).

    One element type on one output: some runners (Beam's DaskRunner) mix a multi-output ParDo's outputs into
    one collection, so the digest travels inside the main output instead of on a tagged one.
    """
    result: "stages.SplitResult"
    digest: InputFile  # path, bytes read, sha256 of them


@dataclass(frozen=True)
class TokenizedFile:
    """What splitting and tokenizing one input file in one worker hands on (shard_pipeline.SplitAndTokenizeFile):
    its split and the units of its chunks, in chunk order."""
    split: SplitOutput
    units: tuple  # (stages.UnitResult, ...)


@dataclass
class CommitParts:
    """Every stage's results, gathered into one element for the commit (pipeline/shard/shard_pipeline.py)."""
    splits: list = field(default_factory=list)  # [SplitOutput]
    units: list = field(default_factory=list)  # [stages.UnitResult]
    shards: list = field(default_factory=list)  # [stages.ShardResult]

    @classmethod
    def gather(cls, elements: Iterable) -> "CommitParts":
        parts = cls()
        for e in elements:
            if isinstance(e, SplitOutput):
                parts.splits.append(e)
            elif isinstance(e, stages.UnitResult):
                parts.units.append(e)
            elif isinstance(e, stages.ShardResult):
                parts.shards.append(e)
            else:
                raise TypeError(f"not a stage result: {type(e).__name__}")
        return parts
