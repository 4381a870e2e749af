"""Resume checks an input's content, not its name, size and mtime: the sha256 of every input file whose finished
work an earlier run left is compared with the sha256 that run recorded before it cut the file.

A file rewritten in place with the same size and mtime (a `cp --preserve`, an rsync, a restore) kept its
resume ledger row (pipeline/shard/resume.py `_mismatch`: path, bytes, mtime / ETag), so its finished units
were reused and the manifest's ledger recorded the sha256 of the old bytes. Now:

  staging/inputs/f000003.json   {fingerprint, file_idx, digest: {path, bytes, sha256}}: written by the worker
                                that cuts the file, before it cuts it (`mark_input`); the cut stage hands on
                                this digest, so the ledger's sha256 is of the bytes the units were cut from
                                (computed where it was before, by the cut stage: one full read of the file
                                besides the cut, as before)
  done/cut-f000003.json         its `digest` (transforms/shard/records.py InputFile) is the same record

On the driver (`screen`, from pipeline/shard/resume.py reconcile, under the output's lock): every input with a
finished cut or unit is hashed again (full sha256, threads: hashlib releases the GIL) and compared. A file
whose bytes changed has its finished work discarded, and so have the packed shards and the near-dedup stage
(they were built from every unit); a unit whose file has no recorded digest (a staging written before digests
were recorded, and that file not finished) cannot be proven and is redone. Each with a note.
"""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

from model_contract.hashing import sha256_file
from transforms.io import io_utils
from transforms.shard import layout
from transforms.shard.layout import Layout
from transforms.shard.records import InputFile

CHECK_THREADS = 4
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FILE_OF = re.compile(r"(?:cut|unit)-f([0-9]{6})(?:-c[0-9]{5})?")


def record_path(staging_dir: str, file_idx: int) -> str:
    return Layout(staging_dir, "").path(layout.input_digest(file_idx))


def digest_of(path: str) -> InputFile:
    size, sha = sha256_file(path, opener=io_utils.open_read)
    return InputFile(path, size, sha256=sha)


def mark_input(plan, file_idx: int, path: str) -> InputFile:
    """Hash input `file_idx` as it is now and record it in staging before any of its units is cut."""
    digest = digest_of(path)
    io_utils.write_bytes(record_path(plan.staging_dir, file_idx), json.dumps(
        {"fingerprint": plan.generation, "file_idx": file_idx, "digest": digest.to_dict()},
        sort_keys=True).encode("utf-8"))
    return digest


def recorded_sha256(plan, file_idx: int) -> Optional[str]:
    """The sha256 the staging recorded for input `file_idx` (None: none, or not this run's, or malformed)."""
    try:
        rec = json.loads(io_utils.read_bytes(record_path(plan.staging_dir, file_idx)))
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("fingerprint") != plan.generation or rec.get("file_idx") != file_idx:
        return None
    digest = rec.get("digest")
    if not isinstance(digest, dict) or digest.get("path") != plan.ledger[file_idx].path:
        return None
    sha = digest.get("sha256")
    return sha if isinstance(sha, str) and _SHA256.fullmatch(sha) else None


def _cut_sha256(marker: dict) -> Optional[str]:
    digest = (marker.get("result") or {}).get("digest")
    sha = digest.get("sha256") if isinstance(digest, dict) else None
    return sha if isinstance(sha, str) and _SHA256.fullmatch(sha) else None


@dataclass(frozen=True)
class Screened:
    """What the content check discards: marker names, and one note per reason."""
    discard: frozenset[str]
    notes: tuple[str, ...]


def screen(plan, markers: dict, hasher=digest_of) -> Screened:
    """`markers`: {name: marker} that passed markers.check_marker. Which of them the inputs' current content
    forbids reusing (see the module docstring)."""
    files: dict = {}
    for name in markers:
        m = _FILE_OF.fullmatch(name)
        if m:
            files.setdefault(int(m.group(1)), []).append(name)
    recorded, notes = {}, []
    for idx in sorted(files):
        shas = {s for s in (recorded_sha256(plan, idx), *(_cut_sha256(markers[n]) for n in files[idx]
                                                           if n.startswith("cut-"))) if s is not None}
        if len(shas) == 1:
            recorded[idx] = shas.pop()
        elif len(shas) > 1:
            recorded[idx] = ""  # two runs recorded two contents: whatever it is now, one of them is stale
    with ThreadPoolExecutor(CHECK_THREADS) as pool:
        current = dict(zip(sorted(recorded), pool.map(lambda i: _current_sha256(plan, i, hasher), sorted(recorded))))
    changed = sorted(i for i in recorded if current[i] != recorded[i])
    unproven = sorted(set(files) - set(recorded))
    discard = {n for i in changed + unproven for n in files[i]}
    for i in changed:
        notes.append(f"resume: input {plan.ledger[i].path} changed since an earlier run read it (its sha256 is "
                     f"{str(current[i])[:12]}…, not {recorded[i][:12] or 'one recorded value'}…): its "
                     f"{len(files[i])} finished cut/unit(s) are redone")
    if changed:
        dependent = {n for n in markers if n.startswith("pack-") or n == "near-dedup"}
        if dependent:
            notes.append(f"resume: {len(dependent)} packed shard(s) / near-dedup result(s) of an earlier run are "
                         f"redone (built from the changed input)")
        discard |= dependent
    if unproven:
        notes.append(f"resume: {sum(len(files[i]) for i in unproven)} finished unit(s) of {len(unproven)} input "
                     f"file(s) have no recorded sha256 (a staging of an older pileprep); they are redone")
    return Screened(frozenset(discard), tuple(notes))


def _current_sha256(plan, file_idx: int, hasher) -> Optional[str]:
    try:
        return hasher(plan.ledger[file_idx].path).sha256
    except OSError:
        return None
