"""Publishing a dataset: the manifest is written last and is the commit point.

Shards of a run live in their own generation directory (`gen-<fingerprint>/`) that no committed manifest
points at until the new manifest replaces the old one in a single step: `os.replace` of a fully written and
fsynced temp file on POSIX paths (EFS/FSx included), a single PUT on object stores (an S3 object appears whole
or not at all). A run killed at any moment therefore leaves the previous dataset or nothing visible.
"""
from __future__ import annotations

from typing import Optional

from model_contract import MANIFEST_NAME, Manifest
from transforms import io_utils


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
    if io_utils.is_local(path):
        io_utils.replace_atomically(path, data)
    else:
        io_utils.write_bytes(path, data)
    return path


class ConcurrentCommitError(RuntimeError):
    """Another run committed to the same output while this one was running; nothing was published."""


def committed_generation(output_dir: str) -> Optional[str]:
    m = read_committed(output_dir)
    return None if m is None else m.extra.get("generation")


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

    current = read_committed(output_dir)
    current_gen = None if current is None else current.extra.get("generation")
    new_gen = manifest.extra.get("generation")
    if current_gen not in (expected_previous, new_gen):
        raise ConcurrentCommitError(
            f"{output_dir}: the committed generation changed from {expected_previous} to {current_gen} while this "
            f"run was writing {new_gen}; run one job per output at a time. Nothing was published.")
    # Durable before referenced: a power loss after the manifest's fsync must not leave it naming lost shards.
    io_utils.fsync_files(io_utils.join(output_dir, rel) for rel in
                         [s.path for s in manifest.shards if s.path.startswith(str(new_gen) + "/")] +
                         [d for d in manifest.dead_letters if d.startswith(str(new_gen) + "/")])
    path = publish_manifest(output_dir, manifest.to_json())
    io_utils.delete_tree(staging_dir)
    keep = incremental.referenced_generations(manifest)
    for gen in sorted(incremental.referenced_generations(previous) - keep):
        io_utils.delete_tree(io_utils.join(output_dir, gen))
    return path
