"""Incremental runs: list the inputs, diff them against the committed ledger, check the new run fits.

A dataset is a list of *generations*. Each generation is one run's shards in `<output>/gen-<fingerprint>/`,
built from a set of input files that no other generation holds. The manifest carries:

  ledger       one row per input file the dataset holds: path, bytes, mtime, etag (object stores),
               sha256 of the file's bytes, and the generation that holds it;
  generations  one row per generation, in commit order, with its totals;
  generation   the newest generation (what a plain re-run compares against).

These are typed fields of `model_contract.Manifest`, validated when a manifest is loaded: generation names are
read back to decide what to delete, so only names of the generated form are ever accepted.

This module lists, diffs and checks compatibility; building the ledger and generation rows and merging a new
generation into the committed manifest live beside the integrity sections' merge (pipeline/shard/integrity.py).

`--incremental` lists the inputs, diffs them against the ledger and processes only the new files into a
new generation; the new manifest lists every generation's shards with totals summed. A file that changed
or disappeared since it was ingested is an error naming the files (mixing two versions of a file silently
would make the dataset unreproducible); rebuild without `--incremental` to take such changes.

Change detection is cheap first: size, then mtime (local) or ETag (object stores). A file whose size is the
same but whose mtime/ETag moved (a `touch`, a re-upload of the same bytes) is re-hashed on the driver and is
unchanged if its sha256 still matches.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any

from apache_beam.io.filesystems import FileSystems

from model_contract import Manifest
from model_contract.manifest_rows import LedgerRow
from model_contract.hashing import sha256_file
from pipeline.config import ShardConfig
from pipeline.errors import ConfigError
from pipeline.ops.input_checks import match_input
from pipeline.ops.redaction import redact
from transforms.io import io_utils

LOG = logging.getLogger("pileprep.incremental")
# Config fields that may differ between generations: they decide how many shards a run writes and how work
# is cut, not what a document becomes. Everything else must match (it shapes every example).
NON_SHAPING_CONFIG = ("inputs", "val_inputs", "test_inputs", "num_shards", "target_shard_mb", "unit_mb")


class InputsChangedError(ConfigError):
    """Files the dataset already holds changed or disappeared; the message names them."""


class IncompatibleGenerationError(ConfigError):
    """The new run would produce examples that do not match the committed dataset's contract/config."""


# ------------------------------------------------------------------------------------------------ listing
def list_inputs(globs) -> list:
    """Expand globs to sorted ledger rows {path, bytes, mtime[, etag]}; a glob matching nothing is an error."""
    found = {}
    for pattern in globs:
        try:
            metadata = match_input(pattern)
        except Exception as e:  # noqa: BLE001 - Beam raises BeamIOError with nested causes
            raise ConfigError(f"--input {pattern}: cannot list it ({redact(str(e))})") from None
        files = [m for m in metadata if not m.path.endswith("/")]
        if not files:
            raise ConfigError(f"--input {pattern}: no such file (nothing matches)")
        for m in files:
            row = {"path": m.path, "bytes": int(m.size_in_bytes), "mtime": float(m.last_updated_in_seconds or 0.0)}
            if not io_utils.is_local(m.path):
                try:
                    row["etag"] = str(FileSystems.checksum(m.path)).strip('"')
                except Exception:  # noqa: BLE001 - a store without ETags falls back to size + mtime
                    pass
            found[m.path] = row
    return [found[p] for p in sorted(found)]


def file_sha256(path: str) -> tuple:
    """(bytes, sha256) of a file's raw bytes, streamed; local paths and object stores alike."""
    return sha256_file(path, opener=io_utils.open_read)


# --------------------------------------------------------------------------------------------------- diff
@dataclass
class LedgerDiff:
    # A current row is list_inputs' listing row, JSON-shaped: {path: str, bytes: int, mtime: float[, etag: str]}.
    new: list[dict[str, Any]] = field(default_factory=list)  # current rows not in the ledger
    unchanged: list[dict[str, Any]] = field(default_factory=list)
    changed: list[tuple[LedgerRow, dict[str, Any]]] = field(default_factory=list)  # (LedgerRow, current row)
    removed: list[LedgerRow] = field(default_factory=list)  # no longer listed
    touched: list[dict[str, Any]] = field(default_factory=list)  # same bytes, new mtime/etag (not a change)

    def problems(self) -> list:
        out = []
        for old, cur in self.changed:
            what = (f"size {old.bytes} -> {cur['bytes']}" if old.bytes != cur["bytes"]
                    else "same size, different content (sha256)")
            out.append(f"changed since generation {old.generation or '?'}: {cur['path']} ({what})")
        for old in self.removed:
            out.append(f"removed since generation {old.generation or '?'}: {old.path}")
        return out

    def summary(self) -> str:
        return (f"{len(self.new)} new, {len(self.unchanged)} already held, {len(self.changed)} changed, "
                f"{len(self.removed)} removed")


def _same_version_key(old: LedgerRow, cur: dict) -> bool:
    if old.etag is not None and "etag" in cur:
        return old.etag == cur["etag"]
    return old.mtime is not None and old.mtime == cur.get("mtime")


def diff_ledger(ledger: list, current: list, hasher=file_sha256) -> LedgerDiff:
    """Compare the committed ledger ([LedgerRow]) with the current listing rows (see the module doc for the
    rules)."""
    held = {row.path: row for row in ledger}
    diff = LedgerDiff()
    for cur in current:
        old = held.pop(cur["path"], None)
        if old is None:
            diff.new.append(cur)
        elif old.bytes != cur["bytes"]:
            diff.changed.append((old, cur))
        elif _same_version_key(old, cur):
            diff.unchanged.append(cur)
        elif old.sha256:
            _size, sha = hasher(cur["path"])
            if sha == old.sha256:
                diff.touched.append(cur)
                diff.unchanged.append(cur)
            else:
                diff.changed.append((old, cur))
        else:  # a ledger row without a checksum: size is all we can compare, and it matched
            diff.unchanged.append(cur)
    diff.removed = sorted(held.values(), key=lambda r: r.path)
    return diff


def raise_for_changes(diff: LedgerDiff, output: str) -> None:
    problems = diff.problems()
    if problems:
        raise InputsChangedError(
            f"--incremental: {len(problems)} input file(s) the dataset at {output} already holds changed or "
            "disappeared; an incremental run only adds new files and will not mix versions:\n  "
            + "\n  ".join(problems)
            + "\nRestore those files, or rebuild the dataset without --incremental (into a new --output to keep "
              "the current one readable meanwhile).")


# ------------------------------------------------------------------------------------------- compatibility
def _shaping(config: dict) -> dict:
    return {k: v for k, v in config.items() if k not in NON_SHAPING_CONFIG}


def _shown(config: dict, key: str) -> str:
    """A config value as the message shows it: ShardConfig.to_manifest_dict leaves a setting out at its default
    (or with its stage off) so that generation names stay, so an absent key is its default, not None."""
    if key in config:
        return repr(config[key])
    default = next((f.default for f in dataclasses.fields(ShardConfig) if f.name == key), dataclasses.MISSING)
    return "absent" if default is dataclasses.MISSING else f"{default!r} (the default)"


def check_compatible(previous: Manifest, contract_dict: dict, config_dict: dict) -> None:
    """A new generation must produce the same kind of example as the ones already committed."""
    problems = []
    old_c, new_c = previous.contract.to_dict(), contract_dict
    for key in sorted(set(old_c) | set(new_c)):
        if old_c.get(key) != new_c.get(key):
            problems.append(f"contract.{key}: committed {old_c.get(key)!r}, this run {new_c.get(key)!r}")
    old_s, new_s = _shaping(previous.config), _shaping(config_dict)
    for key in sorted(set(old_s) | set(new_s)):
        if old_s.get(key) != new_s.get(key):
            problems.append(f"config.{key}: committed {_shown(old_s, key)}, this run {_shown(new_s, key)}")
    if problems:
        raise IncompatibleGenerationError(
            "--incremental: this run would write examples unlike the committed dataset's, so they cannot be one "
            "dataset:\n  " + "\n  ".join(problems) + "\nUse the committed settings (--seq-len, --tokenizer, ...) or "
            "write a new dataset to another --output.")
