"""Where a dataset's files are: the manifest's location in a dataset directory, and the manifest-relative paths
inside it, resolved and refused when they leave the dataset (local paths and URLs such as s3://).
"""
from __future__ import annotations

import os
import posixpath

from model_contract.manifest_rows import ShardInfo
from model_contract.schema import check_relative_path

MANIFEST_NAME = "manifest.json"


def _join(base: str, rel: str) -> str:
    return posixpath.join(base, rel) if "://" in base else os.path.join(base, rel)


def manifest_path(dataset_dir: str) -> str:
    return _join(dataset_dir.rstrip("/") if "://" in dataset_dir else dataset_dir, MANIFEST_NAME)


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
