"""Publishing a dataset: the manifest is written last and is the commit point.

Shards of a run live in their own generation directory (`gen-<fingerprint>/`) that no committed manifest
points at until the new manifest replaces the old one in a single step: `os.replace` of a fully written and
fsynced temp file on POSIX paths (EFS/FSx included), a single PUT on object stores (an S3 object appears whole
or not at all). A run killed at any moment therefore leaves the previous dataset or nothing visible.
"""
from __future__ import annotations

import os
from typing import Optional

from model_contract import MANIFEST_NAME, Manifest
from model_contract.manifest import check_generation_name
from pipeline.config import ConfigError
from transforms.io import io_utils


# What an output holds, recorded in its manifest (`kind`); a commit never lands in an output of another kind.
KIND_DATASET = "dataset"
KIND_RETRIEVAL_DB = "retrieval-db"
KIND_SIDECAR = "sidecar"
READ = object()  # "read the committed manifest yourself" (pipeline/shard/plan.py: make_plan's default)


def manifest_location(output_dir: str) -> str:
    return io_utils.join(output_dir, MANIFEST_NAME)


def read_committed(output_dir: str) -> Optional[Manifest]:
    path = manifest_location(output_dir)
    if not io_utils.exists(path):
        return None
    return Manifest.from_json(io_utils.read_bytes(path).decode("utf-8"))


def publish_manifest(output_dir: str, manifest_json: str) -> str:
    path = manifest_location(output_dir)
    data = manifest_json.encode("utf-8")
    io_utils.publish_bytes(path, data)
    return path


class ConcurrentCommitError(RuntimeError):
    """Another run committed to the same output while this one was running; nothing was published."""


def committed_generation(output_dir: str) -> Optional[str]:
    m = read_committed(output_dir)
    return None if m is None else m.generation


# ------------------------------------------------------------------------------------ path containment
def _normal(path: str) -> str:
    """A comparable form of a path: resolved (symlinks, `..`) for local paths, slash-normalised for URLs."""
    if io_utils.is_local(path):
        return os.path.realpath(os.path.abspath(path))
    scheme, rest = path.split("://", 1)
    parts = [p for p in rest.split("/") if p not in ("", ".")]
    return scheme + "://" + "/".join(parts)


def _inside(path: str, root: str) -> bool:
    """`path` equals `root` or lies under it (both normalised)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_staging_dir(output_dir: str, staging_root: Optional[str]) -> None:
    """Refuse a `--staging-dir` whose deletion after the commit could remove the dataset.

    Staging is deleted after every commit; it must therefore not be the output itself, contain it, or be (or
    contain, or lie inside) one of the output's generation directories. `<output>/_staging` (the default) and
    any other directory are fine.
    """
    if not staging_root:
        return
    out, staging = _normal(output_dir), _normal(staging_root)
    problem = None
    if _inside(out, staging):
        problem = "is the output directory or contains it"
    elif _inside(staging, out):
        head = staging[len(out.rstrip("/")) + 1:].split("/", 1)[0]
        if head.startswith("gen-") or head == MANIFEST_NAME:
            problem = f"lies inside the dataset's {head} (generation directories hold committed shards)"
    if problem:
        raise ConfigError(f"--staging-dir {staging_root}: {problem}; staging is deleted after each commit, so use "
                          f"a separate directory (default: {io_utils.join(output_dir, '_staging')})")


def _check_deletable(path: str, output_dir: str, keep_paths) -> None:
    """Never delete the output, anything containing it, or a path the new manifest references."""
    target, out = _normal(path), _normal(output_dir)
    if _inside(out, target):
        raise RuntimeError(f"refusing to delete {path}: it is (or contains) the output directory {output_dir}")
    for kept in keep_paths:
        k = _normal(kept)
        if _inside(k, target) or _inside(target, k):
            raise RuntimeError(f"refusing to delete {path}: the new manifest references {kept}")


def commit_dataset(output_dir: str, manifest: Manifest, expected_previous: Optional[str], staging_dir: str,
                   previous: Optional[Manifest] = None) -> str:
    """Publish `manifest` (the commit point), then clean up what no manifest references any more.

    `expected_previous` is the generation the run started from; if the committed manifest moved meanwhile
    (a concurrent run on the same output), refuse instead of silently dropping the other run's generation.
    Re-running a commit that already happened (Beam retrying the bundle) is a no-op publish of equal bytes.
    Order matters for crash safety: the new shards are complete before this is called, the manifest flips in
    one step, and only then are staging and unreferenced generations deleted (a crash in between leaves
    garbage, never a dangling reference).
    """
    from pipeline.ops import incremental  # noqa: PLC0415 - avoid a cycle at import time

    manifest.validate()  # the paths below come from it: never act on a name of the wrong form
    current = read_committed(output_dir)
    current_gen = None if current is None else current.generation
    new_gen = check_generation_name(manifest.generation)
    if current_gen not in (expected_previous, new_gen):
        raise ConcurrentCommitError(
            f"{output_dir}: the committed generation changed from {expected_previous} to {current_gen} while this "
            f"run was writing {new_gen}; run one job per output at a time. Nothing was published.")
    # Durable before referenced: a power loss after the manifest's fsync must not leave it naming lost shards.
    io_utils.fsync_files(io_utils.join(output_dir, rel) for rel in
                         [s.path for s in manifest.shards if s.path.startswith(str(new_gen) + "/")] +
                         [d for d in manifest.dead_letters if d.startswith(str(new_gen) + "/")])
    keep = incremental.referenced_generations(manifest)
    heads = keep | {rel.split("/", 1)[0] for rel in [s.path for s in manifest.shards] + manifest.dead_letters}
    keep_paths = [io_utils.join(output_dir, h) for h in sorted(heads)] + [manifest_location(output_dir)]
    _check_deletable(staging_dir, output_dir, keep_paths)  # before publishing: a refused commit changes nothing
    path = publish_manifest(output_dir, manifest.to_json())
    io_utils.delete_tree(staging_dir)
    for gen in sorted(incremental.referenced_generations(previous) - keep):
        old = io_utils.join(output_dir, check_generation_name(gen))  # a direct child of the output, by form
        _check_deletable(old, output_dir, keep_paths)
        io_utils.delete_tree(old)
    return path
