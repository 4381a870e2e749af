"""Publishing a dataset: the manifest is written last and is the commit point.

Shards of a run live in their own generation directory (`gen-<fingerprint>/`) that no committed manifest
points at until the new manifest replaces the old one in a single step: `os.replace` of a fully written and
fsynced temp file on POSIX paths (EFS/FSx included), a single PUT on object stores (an S3 object appears whole
or not at all). A run killed at any moment therefore leaves the previous dataset or nothing visible.

A dataset commit also writes the generation's own manifest (`generations/<gen>.manifest.json`) before the
live one, and afterwards removes only the generations pipeline/ops/generations.py says nobody keeps: the
`--keep-generations` newest previous ones and every ref-named one stay, so a trainer reading the previous
manifest keeps finding its files. The refs are read *after* the publish (model_contract/refs.py: pinning).
"""
from __future__ import annotations

import json
import logging
import os
import re
from typing import Optional

from model_contract import MANIFEST_NAME, Manifest
from model_contract.manifest_check import MANIFEST_FORMAT
from model_contract.schema import check_generation_name, check_relative_path
from pipeline.errors import ConfigError
from pipeline.shard import integrity
from pipeline.ops import generations, guards
from pipeline.ops.guards import normal_path
from transforms.io import io_utils

LOG = logging.getLogger("pileprep.commit")

# What an output holds, recorded in its manifest (`kind`); a commit never lands in an output of another kind.
KIND_DATASET = "dataset"
KIND_RETRIEVAL_DB = "retrieval-db"
KIND_SIDECAR = "sidecar"
READ = object()  # "read the committed manifest yourself" (pipeline/shard/plan.py: make_plan's default)


def manifest_location(output_dir: str) -> str:
    return io_utils.join(output_dir, MANIFEST_NAME)


def read_committed(output_dir: str) -> Optional[Manifest]:
    """The output's live manifest, validated (None: none yet). Every command that reads an output starts here or
    at `committed_kind`: a link anywhere inside a local one is refused first (guards.check_no_links_inside)."""
    path = _checked_manifest_location(output_dir)
    if not io_utils.exists(path):
        return None
    return parse_manifest(io_utils.read_bytes(path).decode("utf-8"), output_dir)


def parse_manifest(text: str, where: str) -> Manifest:
    """A dataset's (or sidecar's) manifest from its JSON text. A chunk database's manifest has its own format
    (pipeline/retrieval/store.py): parsed as a dataset's it failed as "not a pileprep manifest
    (format='pileprep.retrieval_db')", which named neither the output nor what it is; it is refused by kind
    instead (ConfigError, exit 2)."""
    try:
        d = json.loads(text)
    except ValueError:
        d = None  # Manifest.from_json reports it
    if isinstance(d, dict) and kind_of(d) == KIND_RETRIEVAL_DB:
        raise ConfigError(f"{where} is a retrieval chunk database, not a dataset: pass a shard dataset's "
                          f"directory")
    return Manifest.from_json(text)


def require_dataset(manifest: Manifest, where: str) -> Manifest:
    """`manifest`, when it is a shard dataset's; else ConfigError (exit 2) naming what `where` holds. A sidecar's
    manifest has the dataset's format and passes its schema, so a command reading datasets (inspect, report,
    export, the retrieval jobs) given a sidecar failed on a missing feature with a KeyError traceback."""
    kind = kind_of(manifest.to_dict())
    if kind != KIND_DATASET:
        raise ConfigError(f"{where}: it holds a {kind}, not a dataset: pass a shard dataset's directory")
    return manifest


def _checked_manifest_location(output_dir: str) -> str:
    guards.check_no_links_inside(output_dir)
    return manifest_location(output_dir)


def publish_manifest(output_dir: str, manifest_json: str) -> str:
    path = manifest_location(output_dir)
    data = manifest_json.encode("utf-8")
    io_utils.publish_bytes(path, data)
    return path


class ConcurrentCommitError(RuntimeError):
    """Another run committed to the same output while this one was running; nothing was published."""


# ------------------------------------------------------------------------------------ path containment
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
    out, staging = normal_path(output_dir), normal_path(staging_root)
    problem = None
    if _inside(out, staging):
        problem = "is the output directory or contains it"
    elif _inside(staging, out):
        head = staging[len(out.rstrip("/")) + 1:].split("/", 1)[0]
        if head.startswith("gen-") or head in (MANIFEST_NAME, generations.refs_mod.GENERATIONS_DIR,
                                                generations.refs_mod.REFS_DIR):
            problem = f"lies inside the dataset's {head} (generation directories hold committed shards)"
    if problem:
        raise ConfigError(f"--staging-dir {staging_root}: {problem}; staging is deleted after each commit, so use "
                          f"a separate directory (default: {guards.staging_root(output_dir, None)})")


def _check_deletable(path: str, output_dir: str, keep_paths) -> None:
    """Never delete the output, anything containing it, or a path the new manifest references."""
    target, out = normal_path(path), normal_path(output_dir)
    if _inside(out, target):
        raise RuntimeError(f"refusing to delete {path}: it is (or contains) the output directory {output_dir}")
    for kept in keep_paths:
        k = normal_path(kept)
        if _inside(k, target) or _inside(target, k):
            raise RuntimeError(f"refusing to delete {path}: the new manifest references {kept}")


def commit_dataset(output_dir: str, manifest: Manifest, expected_previous: Optional[str], staging_dir: str,
                   previous: Optional[Manifest] = None, keep_generations: int = 1) -> str:
    """Publish a shard dataset's `manifest` (the commit point), then clean up what no manifest references.

    `expected_previous` is the generation the run started from; if the committed manifest moved meanwhile
    (a concurrent run on the same output), refuse instead of silently dropping the other run's generation.
    Re-running a commit that already happened (Beam retrying the bundle) is a no-op publish of equal bytes.
    Older generations are pruned (pipeline/ops/generations.py), keeping `keep_generations` previous ones.
    """
    manifest.validate()  # the paths below come from it: never act on a name of the wrong form
    new_gen = check_generation_name(manifest.generation)
    # Its place in the output's history, recorded in the manifest (and so in its generations/ copy): pruning and
    # gc order by it (pipeline/ops/generations.py), not by file times. Under the output's lock, like the commit.
    manifest.commit_seq = generations.next_commit_seq(output_dir, new_gen)
    # ... and the generation live before it, which chains the copies so a swap of their seqs is caught (check_chain)
    manifest.previous_generation_recorded, manifest.previous_generation = \
        generations.previous_of_commit(output_dir, new_gen)
    durable = [s.path for s in manifest.shards if s.path.startswith(str(new_gen) + "/")] + \
        [d for d in manifest.dead_letters if d.startswith(str(new_gen) + "/")]
    keep = integrity.referenced_generations(manifest)
    heads = keep | {rel.split("/", 1)[0] for rel in [s.path for s in manifest.shards] + manifest.dead_letters}
    return commit_output(output_dir, KIND_DATASET, manifest.to_json(), new_gen, expected_previous, staging_dir,
                         durable, heads, integrity.referenced_generations(previous) - keep,
                         keep_generations=keep_generations)


def commit_store(output_dir: str, kind: str, manifest: dict, files: list, expected_previous: Optional[str],
                 staging_dir: str) -> str:
    """Publish a retrieval store's manifest (a chunk database or a sidecar, a dict with `generation`): the same
    protocol as a dataset (commit_output), its one generation kept and the previous one removed."""
    new_gen = check_generation_name(manifest.get("generation"))
    for rel in files:
        check_relative_path(rel, "file")
    heads = {new_gen} | {rel.split("/", 1)[0] for rel in files}
    dropped = {expected_previous} - heads if expected_previous else set()
    return commit_output(output_dir, kind, to_canonical_json(manifest), new_gen, expected_previous, staging_dir,
                         list(files), heads, dropped)


def to_canonical_json(d: dict) -> str:
    return json.dumps(d, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def commit_output(output_dir: str, kind: str, manifest_json: str, new_gen: str, expected_previous: Optional[str],
                  staging_dir: str, durable_files: list, keep_heads: set, dropped_generations: set,
                  keep_generations: Optional[int] = None) -> str:
    """The one commit protocol (datasets and retrieval stores): refuse an output of another kind and a
    concurrent commit, make the new files durable, publish the manifest in one step, then delete this run's
    staging and the generations no manifest references any more.

    Order matters for crash safety: the new files are complete before this is called, the manifest flips in
    one step, and only then is anything deleted (a crash in between leaves garbage, never a dangling
    reference; the next run removes the garbage under the lock, pipeline/ops/guards.py: cleanup_abandoned).

    `keep_generations` (datasets): keep generations by history and refs (_prune) instead of removing
    `dropped_generations` at once (retrieval stores, which nothing references by generation yet).
    """
    check_output_kind(output_dir, kind, foreign=False)  # (foreign files: checked at the run's start, pipeline/job.py)
    # A worker killed mid-write leaves its temp file; Spark and Flink re-execute the bundle, whose own temp file is
    # renamed into place, so the killed attempt's would otherwise be committed beside it (issue 31).
    remove_temp_files(io_utils.join(output_dir, check_generation_name(new_gen)))
    current_gen = committed_generation_of(output_dir)
    if current_gen not in (expected_previous, new_gen):
        raise ConcurrentCommitError(
            f"{output_dir}: the committed generation changed from {expected_previous} to {current_gen} while this "
            f"run was writing {new_gen}; run one job per output at a time. Nothing was published.")
    # Durable before referenced: a power loss after the manifest's fsync must not leave it naming lost files.
    io_utils.fsync_files(io_utils.join(output_dir, rel) for rel in durable_files)
    keep_paths = [io_utils.join(output_dir, h) for h in sorted(keep_heads)] + [manifest_location(output_dir)]
    _check_deletable(staging_dir, output_dir, keep_paths)  # before publishing: a refused commit changes nothing
    if keep_generations is not None:
        _write_generation_manifests(output_dir, current_gen, new_gen, manifest_json)
    path = publish_manifest(output_dir, manifest_json)
    _remove_after_commit(staging_dir, "this run's staging")
    if keep_generations is not None:
        _prune(output_dir, keep_heads, keep_generations, keep_paths)
        return path
    for gen in sorted(dropped_generations):
        old = io_utils.join(output_dir, check_generation_name(gen))  # a direct child of the output, by form
        _check_deletable(old, output_dir, keep_paths)
        _remove_after_commit(old, "the previous generation")
    return path


# What a killed writer leaves: transforms/io/io_utils.py _LocalAtomicWriter's `.part` and replace_atomically's
# `.tmp` names (a unique 12-hex id each). Only this run's own directories are swept (its generation, its staging).
TEMP_NAME = re.compile(r"\..+\.[0-9a-f]{12}\.(part|tmp)")


def remove_temp_files(directory: str) -> None:
    """The temp files of killed writers under `directory` (local only: an object store never shows a part-written
    object); links are not followed."""
    if not io_utils.is_local(directory):
        return
    for dirpath, _dirs, names in os.walk(directory):
        for name in names:
            if TEMP_NAME.fullmatch(name):
                try:
                    os.unlink(os.path.join(dirpath, name))
                except FileNotFoundError:
                    pass


def _remove_after_commit(path: str, what: str, remove=io_utils.delete_tree) -> None:
    """After the publish the commit stands: a removal that fails is said (a warning naming what is left and who
    removes it), neither swallowed nor turned into a failed run."""
    try:
        remove(path)
    except OSError as e:
        LOG.warning("committed, but could not remove %s %s (%s); the next run on this output (or pileprep gc) "
                    "removes it", what, path, e.strerror or type(e).__name__)


def _write_generation_manifests(output_dir: str, current_gen: Optional[str], new_gen: str, manifest_json: str) -> None:
    """The new generation's own manifest; and the live one's, if it was committed before generations kept
    theirs (its bytes are manifest.json's), so the history that pruning orders by names it first."""
    if current_gen is not None and current_gen != new_gen and \
            not io_utils.exists(generations.copy_path(output_dir, check_generation_name(current_gen))):
        generations.write_generation_manifest(output_dir, current_gen,
                                              io_utils.read_bytes(manifest_location(output_dir)).decode("utf-8"))
    generations.write_generation_manifest(output_dir, new_gen, manifest_json)  # fsynced (io_utils.publish_bytes)


def _prune(output_dir: str, live_heads: set, keep_generations: int, keep_paths: list) -> None:
    """After the publish: remove the generations nobody keeps (refs are read now, after the new manifest is
    visible, so a trainer pinning concurrently either sees this commit or is seen by it). The order was checked
    before the publish (generations.next_commit_seq); a copy changed since then leaves every generation in place."""
    try:
        state = generations.read_state(output_dir, {h for h in live_heads if h.startswith("gen-")})
    except generations.HistoryError as e:
        LOG.warning("committed, but removed no previous generation: %s", e)
        return
    for gen, _why in generations.plan_prune(state, keep_generations, drop_stale_refs=False).remove:
        _check_deletable(io_utils.join(output_dir, check_generation_name(gen)), output_dir, keep_paths)
        _remove_after_commit(gen, "the generation", lambda g: generations.remove_generation(output_dir, g))


# ------------------------------------------------------------------------------------------- output kinds
KINDS = (KIND_DATASET, KIND_RETRIEVAL_DB, KIND_SIDECAR)
RETRIEVAL_DB_FORMAT = "pileprep.retrieval_db"
# What an output directory may hold besides what its manifest names, before its first commit: pileprep's own
# lock, staging, temp manifests and write probes, and generation directories (a crashed first run's).
_OWN_ENTRY = re.compile(r"(\.pileprep\.lock|_staging|manifest\.json|\.manifest\.json\..*\.tmp|generations|\.refs|"
                        r"\.pileprep-write-probe-\d+|gen-[0-9a-f]{16})")


def kind_of(manifest: dict) -> str:
    """The kind a committed manifest records, or (written before kinds were recorded) the one its shape says."""
    kind = manifest.get("kind")
    if isinstance(kind, str) and kind:
        return kind
    if manifest.get("format") == RETRIEVAL_DB_FORMAT:
        return KIND_RETRIEVAL_DB
    if manifest.get("format") == MANIFEST_FORMAT:
        return KIND_SIDECAR if "retrieval" in manifest else KIND_DATASET
    return f"unknown (format {manifest.get('format')!r})"


def committed_kind(output_dir: str) -> Optional[str]:
    """The kind of what `output_dir` holds (None: no manifest)."""
    path = _checked_manifest_location(output_dir)
    if not io_utils.exists(path):
        return None
    try:
        d = json.loads(io_utils.read_bytes(path).decode("utf-8"))
    except ValueError:
        return "unknown (manifest.json is not JSON)"
    return kind_of(d) if isinstance(d, dict) else "unknown (manifest.json is not an object)"


def committed_generation_of(output_dir: str) -> Optional[str]:
    """The generation the output's manifest names, whatever its kind (None: no manifest)."""
    path = _checked_manifest_location(output_dir)
    if not io_utils.exists(path):
        return None
    d = json.loads(io_utils.read_bytes(path).decode("utf-8"))
    return d.get("generation") if isinstance(d, dict) else None


def foreign_entries(output_dir: str, staging_root: Optional[str] = None) -> list:
    """Entries of a local output directory that pileprep did not create (object stores: not listed)."""
    if not io_utils.is_local(output_dir) or not os.path.isdir(output_dir):
        return []
    staging = normal_path(staging_root) if staging_root else None
    out = []
    for name in sorted(os.listdir(output_dir)):
        if _OWN_ENTRY.fullmatch(name) or (staging and normal_path(os.path.join(output_dir, name)) == staging):
            continue
        out.append(name)
    return out


def check_no_links(output_dir: str, flag: str = "--output") -> None:
    """ConfigError (exit 2) when a local output holds a symbolic link anywhere inside (its own directories,
    a generation directory, a generation manifest, a shard): its reads, writes and removals would land wherever
    the link points (files the command did not create). Checked at a job's start, under the lock and before
    anything is read or removed, and again at the commit."""
    guards.check_no_links_inside(output_dir, flag)


def check_output_kind(output_dir: str, kind: str, staging_root: Optional[str] = None, flag: str = "--output",
                      foreign: bool = True) -> None:
    """ConfigError (exit 2) unless `output_dir` is empty, pileprep's own, or already holds `kind`: no command
    commits into another kind of output (a sidecar over a dataset would replace its manifest and delete its
    generation), nor into a directory of files it did not create."""
    check_no_links(output_dir, flag)
    found = committed_kind(output_dir)
    if found is not None and found != kind:
        raise ConfigError(f"{flag} {output_dir}: it holds a {found} (manifest.json), not a {kind}; a {kind} is "
                          f"never committed into another kind of output: choose another {flag}")
    if found is None and foreign:
        entries = foreign_entries(output_dir, staging_root)
        if entries:
            shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
            raise ConfigError(f"{flag} {output_dir}: it holds files pileprep did not create ({shown}); a {kind} "
                              f"is committed only into an empty or new directory: choose another {flag}")
