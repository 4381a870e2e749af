"""Names of files derived one-per-shard (Parquet exports, neighbour sidecars), unique across generations.

A dataset's shard paths are unique only as whole relative paths: an incremental dataset holds
`gen-A/train-00000-of-00001.tfrecord` and `gen-B/train-00000-of-00001.tfrecord` (pipeline/ops/incremental.py
adds one generation directory per run). Naming a derived file by the shard's basename therefore lets the second
generation's file overwrite the first's. The derived name keeps the shard's directories and changes only the
basename, and every list of derived names is checked for collisions before anything is written.
"""
from __future__ import annotations

import posixpath
from typing import Iterable, Optional

from model_contract.schema import check_relative_path


class NameCollisionError(ValueError):
    """Two shards would be written to one derived file."""


def derived_path(shard_path: str, prefix: str = "", suffix: Optional[str] = None, old_suffix: str = ".tfrecord",
                 root: str = "") -> str:
    """`shard_path` with its basename given `prefix` and (when it ends in `old_suffix`) `suffix` instead.

    `derived_path("gen-a/train-00000-of-00002.tfrecord", suffix=".parquet")` is
    `gen-a/train-00000-of-00002.parquet`; with `prefix="neighbours-", root="gen-s"` the sidecar file
    `gen-s/gen-a/neighbours-train-00000-of-00002.tfrecord`.
    """
    check_relative_path(shard_path, "shard path")
    head, base = posixpath.split(shard_path)
    if suffix is not None:
        base = (base[:-len(old_suffix)] if base.endswith(old_suffix) else base) + suffix
    parts = [p for p in (root, head, prefix + base) if p]
    return "/".join(parts)


def check_unique(pairs: Iterable[tuple]) -> None:
    """Refuse (NameCollisionError) when two (shard path, derived name) pairs share a derived name."""
    seen: dict = {}
    for shard, name in pairs:
        if name in seen and seen[name] != shard:
            raise NameCollisionError(f"shards {seen[name]} and {shard} would both be written to {name}")
        seen[name] = shard


def sidecar_path(sidecar_generation: str, shard_path: str) -> str:
    """The neighbours sidecar file of one dataset shard, inside the sidecar's generation directory."""
    return derived_path(shard_path, prefix="neighbours-", root=sidecar_generation)


def shard_entry(manifest: dict, dataset: str, path: str) -> dict:
    """The manifest entry of the shard file at `path` (as `io_utils.join(dataset, entry path)` spells it)."""
    from transforms.io import io_utils  # noqa: PLC0415

    for shard in manifest["shards"]:
        if io_utils.join(dataset, shard["path"]) == path:
            return shard
    raise KeyError(f"{path} is not a shard of the dataset's manifest")
