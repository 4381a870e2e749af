"""The shard job's configuration: one typed place, validated before any work starts.

A bad configuration fails fast with a message that names the knob (`--seq-len`, `--input`, `--tokenizer`);
bad *data* never fails the run (it is filtered or dead-lettered instead).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Optional

from transforms.documents import SPLITS

PILEPREP_VERSION = "0.1.0"
BYTES_PER_TOKEN_ESTIMATE = 6.0  # serialized int64 varints of 3 features + framing, measured on the sample


class ConfigError(ValueError):
    """The configuration cannot work; the message says which option to change."""


class RunError(RuntimeError):
    """The run failed and committed nothing (exit 1); the message is one line saying why."""


class RunInterrupted(BaseException):
    """SIGINT / SIGTERM: the run stopped, removed its partial generation and committed nothing."""

    def __init__(self, signum):
        # Beam re-raises a failed bundle's exception as the same type with its message augmented, so the
        # argument is either the signal number or such a message ("interrupted by signal 15 [while running..]").
        if not isinstance(signum, int):
            found = re.search(r"signal (\d+)", str(signum))
            signum = int(found.group(1)) if found else 2
        super().__init__(f"interrupted by signal {int(signum)}")
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@dataclass(frozen=True)
class ShardConfig:
    inputs: tuple  # globs
    output: str
    tokenizer: str
    seq_len: int = 2048
    num_shards: Optional[int] = None  # train shards; val/test get a proportional count (at least 1)
    target_shard_mb: float = 1024.0  # used when num_shards is not given
    val_fraction: float = 0.01
    test_fraction: float = 0.01
    seed: int = 0
    text_field: str = "text"
    source_fields: tuple = ("meta.pile_set_name",)
    unit_mb: float = 32.0  # raw text per tokenization work unit (the parallelism grain)
    max_line_mb: float = 256.0
    staging_dir: Optional[str] = None  # default: <output>/_staging
    break_lock: bool = field(default=False, metadata={
        "help": "remove another run's lock on --output first (only when that run is known to be gone; a "
                "crashed run's lock goes stale by itself after 120 s)"})
    max_dead_letter_fraction: float = field(default=0.5, metadata={
        "help": "fail without committing when more than this fraction of the records read are dead-lettered "
                "(checked once at least 1,000 records were read)"})
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        problems = []
        if not self.inputs:
            problems.append("--input: give at least one path or glob")
        if not self.output:
            problems.append("--output: give an output directory")
        if self.seq_len < 2:
            problems.append(f"--seq-len must be at least 2, got {self.seq_len}")
        if self.num_shards is not None and self.num_shards < 1:
            problems.append(f"--num-shards must be at least 1, got {self.num_shards}")
        if self.target_shard_mb <= 0:
            problems.append(f"--target-shard-mb must be positive, got {self.target_shard_mb}")
        for name, value in (("--val-fraction", self.val_fraction), ("--test-fraction", self.test_fraction)):
            if not 0.0 <= value < 1.0:
                problems.append(f"{name} must be in [0, 1), got {value}")
        if self.val_fraction + self.test_fraction >= 1.0:
            problems.append("--val-fraction + --test-fraction must leave something for train")
        if not 0.0 <= self.max_dead_letter_fraction <= 1.0:
            problems.append(f"--max-dead-letter-fraction must be in [0, 1], got {self.max_dead_letter_fraction}")
        if self.unit_mb <= 0 or self.max_line_mb <= 0:
            problems.append("--unit-mb and --max-line-mb must be positive")
        if problems:
            raise ConfigError("invalid shard configuration:\n  " + "\n  ".join(problems))

    @property
    def unit_bytes(self) -> int:
        return int(self.unit_mb * (1 << 20))

    @property
    def max_line_bytes(self) -> int:
        return int(self.max_line_mb * (1 << 20))

    def to_manifest_dict(self) -> dict:
        """What goes into the manifest: everything that shapes the data, nothing about where or how it ran."""
        d = dataclasses.asdict(self)
        for key in ("output", "staging_dir", "extra", "break_lock", "max_dead_letter_fraction"):
            d.pop(key)
        d["inputs"] = list(self.inputs)
        d["source_fields"] = list(self.source_fields)
        d["splits"] = list(SPLITS)
        return d


def fingerprint(config: ShardConfig, tokenizer_sha256: str, ledger: list, parents=()) -> str:
    """Identity of a dataset generation: config + tokenizer + input ledger (path, size), and for a generation
    that builds on committed ones (incremental), the names of those parents, so that it can never share a name
    (and a directory) with a full build over the same files."""
    identity = {"config": config.to_manifest_dict(), "tokenizer": tokenizer_sha256, "inputs": ledger,
                "version": PILEPREP_VERSION}
    if parents:
        identity["parents"] = sorted(parents)
    blob = json.dumps(identity, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]
