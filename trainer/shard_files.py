"""The shard files under the loader: paths kept inside the dataset, integrity against the manifest, and the
record-offset index.

Records are located through a **record-offset index** per shard (walked once and cached, see `shard_offsets`),
so each record is read exactly once, by seeking: no stream walks the headers of records it does not own.

Integrity: every shard's size and record count are checked against the manifest when the loader opens it
(model_contract/checked_reader.py, the check every reader of shards makes); with `verify_data`, its sha256 too
(`prepare_shards`, once per shard per node). Shard paths must stay inside the dataset directory
(`model_contract.resolve_shard_path`).
"""
from __future__ import annotations

import os
import tempfile
from typing import Optional

import numpy as np

from model_contract import Manifest, ShardInfo, resolve_shard_path
from model_contract import hashing
from model_contract.checked_reader import count_problem, size_problem
from model_contract.tfrecord import record_offsets
from trainer.config import DataConfig


class DataIntegrityError(ValueError):
    """A shard that does not match its manifest entry (size, record count, sha256) or lies outside the dataset."""


def shard_paths(manifest_file: str, shards: list) -> list:
    """Local paths of the shards; a path outside the dataset directory (absolute, `..`, a symlink out) is refused:
    a manifest must not make the trainer read arbitrary files."""
    root = os.path.realpath(os.path.dirname(os.path.abspath(manifest_file)))
    out = []
    for s in shards:
        try:
            path = resolve_shard_path(manifest_file, s)  # the contract's own containment check
        except ValueError as e:
            raise DataIntegrityError(f"shard {s.path!r}: {e}") from None
        if os.path.isabs(s.path) or os.path.commonpath([root, os.path.realpath(path)]) != root:
            raise DataIntegrityError(f"shard {s.path!r}: outside the dataset directory {root}: refused")
        out.append(path)
    return out


def check_size(path: str, info: ShardInfo) -> None:
    """Always, on open: a missing, cut or replaced shard is refused before training, naming it."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise DataIntegrityError(f"shard {info.path}: cannot open ({e.strerror})") from None
    if size_problem(info, size):
        raise DataIntegrityError(size_problem(info, size))


def sha256_file(path: str) -> str:
    return hashing.sha256_file(path)[1]  # the producer's hash (model_contract/hashing.py)


def default_index_dir(checkpoint_dir: Optional[str]) -> str:
    if checkpoint_dir:
        return os.path.join(checkpoint_dir, "offsets")
    return os.path.join(tempfile.gettempdir(), f"pileprep-offsets-{os.getuid()}")


def _index_file(index_dir: str, info: ShardInfo, path: str) -> str:
    # The file's own identity too, not only the manifest's claim about it: keyed by the manifest alone, a file
    # cut or replaced after its offsets were cached would be read through the intact file's offsets.
    st = os.stat(path)
    return os.path.join(index_dir, f"{info.sha256}-{info.bytes}-{st.st_size}-{st.st_ino}-{st.st_mtime_ns}"
                                   f".offsets.npy")


def shard_offsets(path: str, info: ShardInfo, index_dir: Optional[str], verify: bool = True) -> np.ndarray:
    """Byte offset of every record of a shard: read from the cache beside the run, or walked once and cached.

    The cache is keyed by the manifest's sha256 and size of the shard and by the file's size, inode and mtime
    (`_index_file`), written with temp name + rename.
    """
    cached = _index_file(index_dir, info, path) if index_dir else None
    offsets = None
    if cached and os.path.exists(cached):
        try:
            offsets = np.load(cached)
        except (OSError, ValueError):
            offsets = None
    if offsets is None:
        with open(path, "rb", buffering=1 << 16) as f:
            offsets = np.asarray(record_offsets(f, verify=verify, name=path), dtype=np.int64)
        if cached:
            os.makedirs(index_dir, exist_ok=True)
            tmp = f"{cached}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                np.save(f, offsets)
            os.replace(tmp, cached)
    if count_problem(info, len(offsets)):
        raise DataIntegrityError(count_problem(info, len(offsets)))
    return offsets


def prepare_shards(manifest: Manifest, manifest_file: str, cfg: DataConfig, index_dir: str, local_rank: int = 0,
                   local_world: int = 1) -> list:
    """This node's share of the per-shard work, before training: shard i is checked by local rank
    i mod local_world (once per node, not per rank). Size always; offsets index built and cached; sha256 with
    verify_data. Returns the error messages (empty when every shard of this rank's share is intact)."""
    shards = manifest.shards_for(cfg.split)
    errors = []
    for i, (path, info) in enumerate(zip(shard_paths(manifest_file, shards), shards)):
        if i % local_world != local_rank:
            continue
        try:
            check_size(path, info)
            if cfg.verify_data:
                digest = sha256_file(path)
                if digest != info.sha256:
                    raise DataIntegrityError(f"shard {info.path}: sha256 {digest[:12]}…, the manifest says "
                                             f"{info.sha256[:12]}… (replaced or damaged)")
            shard_offsets(path, info, index_dir, cfg.verify_crc)
        except (DataIntegrityError, ValueError) as e:
            errors.append(str(e))
    return errors
