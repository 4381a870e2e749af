"""Generations a reader still needs: per-generation manifests and references (`<dataset>/.refs/`).

A commit keeps each generation's manifest beside the live one (`generations/<gen>.manifest.json`, the same
canonical bytes as the `manifest.json` it published) and keeps the previous generation(s) on disk, so a
trainer that read the old manifest keeps reading files that still exist. A holder that needs a generation for
longer (a trainer's checkpoints, an export, a sidecar) registers a *reference*: one small JSON file per holder
in `<dataset>/.refs/`. Pruning at the next commit and `pileprep gc` (pipeline/ops/generations.py) never remove
a referenced generation.

This module is the format and the trainer's side (it imports nothing outside model_contract):

  ref file   `.refs/<kind>-<sha256(holder)[:16]>.json`: {format, generation, kind, holder, created}; written
             to a unique temp name and renamed, so a reader sees a whole ref or none. Every ref read back is
             validated (`parse_ref`); a damaged one is named and kept, and its `holder` is only ever compared
             with the filesystem, never opened, written or deleted.
  pinning    `pin_generation`: read the live manifest, write the ref for its generation, read the live
             manifest's generation again. A commit publishes its manifest *before* it reads the refs it prunes
             by (pipeline/ops/commit.py), so either the second read sees that commit (and the pin moves to the
             new generation) or that commit sees the ref: no commit can remove the pinned generation in between.
             This order needs no lock, which matters because a shard run holds the dataset's lock for hours
             and a trainer must not wait for it.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Optional

from model_contract.contract import ContractError
from model_contract.dataset_paths import MANIFEST_NAME
from model_contract.manifest import Manifest, load_manifest
from model_contract.schema import check_generation_name

REFS_DIR = ".refs"
GENERATIONS_DIR = "generations"
REF_FORMAT = "pileprep.ref"
REF_KINDS = ("trainer", "export", "sidecar")
MAX_REF_BYTES = 64 * 1024  # a ref is ~200 bytes; anything far larger is not one of ours
MAX_HOLDER_CHARS = 4096
_REF_NAME = re.compile(r"(trainer|export|sidecar)-[0-9a-f]{16}\.json")
_COPY_NAME = re.compile(r"(gen-[0-9a-f]{16})\.manifest\.json")


class RefError(ContractError):
    """A ref file that is not a valid reference (its name, size, JSON or a field); the message names it."""


@dataclass(frozen=True)
class Ref:
    generation: str
    kind: str
    holder: str  # what needs the generation: a checkpoint directory, an export's output, a sidecar
    created: float

    def file_name(self) -> str:
        return ref_file_name(self.kind, self.holder)

    def to_json(self) -> str:
        return json.dumps({"format": REF_FORMAT, "generation": self.generation, "kind": self.kind,
                           "holder": self.holder, "created": self.created}, sort_keys=True, indent=1) + "\n"


def ref_file_name(kind: str, holder: str) -> str:
    """One file per holder: registering again replaces the holder's previous ref instead of adding one."""
    if kind not in REF_KINDS:
        raise ValueError(f"ref kind {kind!r}: one of {', '.join(REF_KINDS)}")
    return f"{kind}-{hashlib.sha256(holder.encode('utf-8')).hexdigest()[:16]}.json"


def is_ref_name(name: str) -> bool:
    return bool(_REF_NAME.fullmatch(name))


def parse_ref(name: str, data: bytes) -> Ref:
    """The ref a file named `name` holds, or RefError naming the file and what is wrong."""
    where = f"{REFS_DIR}/{name}"
    if not is_ref_name(name):
        raise RefError(f"{where}: not a ref file name (<kind>-<16 hex>.json)")
    if len(data) > MAX_REF_BYTES:
        raise RefError(f"{where}: {len(data)} bytes, more than a ref holds ({MAX_REF_BYTES})")
    try:
        d = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RefError(f"{where}: not JSON ({type(e).__name__})") from None
    if not isinstance(d, dict):
        raise RefError(f"{where}: not a JSON object")
    if d.get("format") != REF_FORMAT:
        raise RefError(f"{where}: format is {str(d.get('format'))[:40]!r}, not {REF_FORMAT!r}")
    try:
        generation = check_generation_name(d.get("generation"), f"{where}: generation")
    except ContractError as e:
        raise RefError(str(e)) from None
    kind, holder, created = d.get("kind"), d.get("holder"), d.get("created")
    if kind not in REF_KINDS or not name.startswith(f"{kind}-"):
        raise RefError(f"{where}: kind {str(kind)[:40]!r} is not {name.split('-', 1)[0]!r}")
    if not isinstance(holder, str) or not holder or len(holder) > MAX_HOLDER_CHARS or "\x00" in holder:
        raise RefError(f"{where}: holder is not a path-like string")
    if ref_file_name(kind, holder) != name:
        raise RefError(f"{where}: its name does not match its holder (a copied or hand-edited ref)")
    if isinstance(created, bool) or not isinstance(created, (int, float)) or not created >= 0:
        raise RefError(f"{where}: created is not a timestamp")
    return Ref(generation, kind, holder, float(created))


def holder_gone(holder: str) -> Optional[bool]:
    """True when the holder is an absolute local path that no longer exists; None when that cannot be told
    (an object-store or relative holder): such a ref is kept until it is removed by hand."""
    if "://" in holder or not os.path.isabs(holder):
        return None
    return not os.path.lexists(holder)


# ------------------------------------------------------------------------------------ local dataset side
def generation_manifest_name(generation: str) -> str:
    return f"{GENERATIONS_DIR}/{check_generation_name(generation)}.manifest.json"


def generation_of_copy(name: str) -> Optional[str]:
    """`gen-…` for a `generations/` entry named `<gen>.manifest.json`, else None."""
    m = _COPY_NAME.fullmatch(name)
    return m.group(1) if m else None


def dataset_dir_of(path: str) -> str:
    """The dataset directory of `--data` (a directory, or its manifest.json)."""
    return os.path.dirname(os.path.abspath(path)) if path.endswith(".json") else path


def load_generation_manifest(dataset_dir: str, generation: str) -> Manifest:
    """The manifest a commit of `generation` published, validated like any manifest; FileNotFoundError naming
    the generation when the dataset no longer keeps it."""
    path = os.path.join(dataset_dir, generation_manifest_name(generation))
    if not os.path.exists(path):
        raise FileNotFoundError(f"{dataset_dir}: generation {generation} is no longer kept ({path} is missing): "
                                f"it was pruned or removed by gc; resume against it is impossible")
    m = load_manifest(path)
    if m.generation != generation:
        raise ContractError(f"{path}: names generation {m.generation}, not {generation}")
    return m


def live_generation(dataset_dir: str) -> Optional[str]:
    with open(os.path.join(dataset_dir, MANIFEST_NAME), encoding="utf-8") as f:
        d = json.loads(f.read())
    return d.get("generation") if isinstance(d, dict) else None


def write_ref_local(dataset_dir: str, ref: Ref) -> str:
    """Write (or replace) a holder's ref under a unique temp name, fsynced, then renamed into `.refs/`."""
    refs = os.path.join(dataset_dir, REFS_DIR)
    os.makedirs(refs, exist_ok=True)
    path = os.path.join(refs, ref.file_name())
    tmp = os.path.join(refs, f".{ref.file_name()}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(ref.to_json().encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def pin_generation(dataset_dir: str, holder: str, kind: str = "trainer", attempts: int = 5) -> str:
    """Register `holder`'s ref to the live generation and return that generation (see the module docstring for
    why the second read makes this safe without the dataset's lock)."""
    for _ in range(attempts):
        generation = check_generation_name(live_generation(dataset_dir), f"{dataset_dir}/{MANIFEST_NAME}: generation")
        write_ref_local(dataset_dir, Ref(generation, kind, holder, round(time.time(), 3)))
        if live_generation(dataset_dir) == generation:
            return generation
    raise RuntimeError(f"{dataset_dir}: the live generation changed {attempts} times while registering "
                       f"{holder} ({socket.gethostname()}); commits are landing back to back, try again")
