"""Driver-side guards against operator mistakes and leftovers of failed runs.

Each function does one check or one cleanup and either returns a result or raises a ConfigError (exit 2, one
line naming the option) / RunError (exit 1). They run on the driver, before Beam starts or after it ends:

  check_local_writable     --output / --staging-dir on a read-only or full filesystem fails in seconds
  sample_text_field        a --text-field that no record has fails before any work, naming the keys seen
  skipped_inputs           glob matches that are directories or dangling symlinks: listed, never silent
  check_dead_letter_rate   a run that dead-letters most of its input is not committed
  damaged_files            "nothing to do" only if every file the manifest names has its recorded size
  check_no_links_inside    a symbolic link anywhere inside an output or dataset is refused before anything there
                           is read, written or removed
  mark_staging / cleanup_abandoned
                           staging of a crashed run carries a marker; the next run on that output (holding
                           the output's lock, so nobody else is writing) removes it, and any generation
                           directory the committed manifest does not reference, except a staging with a
                           resume record (and its generation): the shard job judges those itself
                           (pipeline/shard/resume.py reconcile: reused, or discarded with a note)
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import re
import time
from typing import Optional

from apache_beam.io.filesystems import FileSystems

from model_contract import MANIFEST_NAME, Manifest
from model_contract.dataset_paths import resolve_dataset_path
from model_contract.schema import is_generation_name
from pipeline.errors import ConfigError, RunError
from pipeline.shard import integrity
from transforms.io import io_utils
from transforms.shard.documents import parse_record
from transforms.io.read_records import FileDamage, compression_of, iter_raw_records

LOG = logging.getLogger("pileprep.guards")
STAGING_MARKER = ".pileprep-staging.json"
RESUME_RECORD = "resume.json"  # a resumable staging's owner, generation and input ledger (pipeline/shard/resume.py)
SAMPLE_RECORDS = 200  # records sampled (from the first input files) to check --text-field
SAMPLE_FILES = 3
SAMPLE_SCAN_LINES = 10_000  # per file: blank or damaged lines count too, so the sample never reads a whole file
SAMPLE_SCAN_BYTES = 64 << 20
DEAD_LETTER_MIN_RECORDS = 1000  # below this a high dead-letter rate is likely a small bad file: commit it


# ------------------------------------------------------------------------------------------ writability
def check_local_writable(path: Optional[str], flag: str) -> None:
    """ConfigError unless `path` can be written: an existing directory gets a small probe file written, fsynced
    and deleted (4 KiB of data, so a full disk fails here too, not only a read-only one); a path that does not
    exist yet is not created here (a run that fails its other checks leaves nothing behind): its nearest
    existing ancestor must be a writable directory (`access` reports a read-only filesystem even to root)."""
    if not path or not io_utils.is_local(path):
        return
    if not os.path.exists(path):
        ancestor = os.path.dirname(os.path.abspath(path))
        while not os.path.exists(ancestor):
            ancestor = os.path.dirname(ancestor)
        if not os.path.isdir(ancestor):
            raise ConfigError(f"{flag} {path}: not writable ({ancestor} is not a directory)")
        if not os.access(ancestor, os.W_OK | os.X_OK):
            raise ConfigError(f"{flag} {path}: not writable (cannot create it in {ancestor}: read-only or no "
                              "permission); choose a writable location with free space")
        return
    probe = os.path.join(path, f".pileprep-write-probe-{os.getpid()}")
    try:
        if not os.path.isdir(path):
            raise NotADirectoryError(20, "not a directory")
        with io_utils.open_write(probe) as f:
            f.write(b"\0" * 4096)
        fd = os.open(probe, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise ConfigError(f"{flag} {path}: not writable ({e.strerror or type(e).__name__}); choose a writable "
                          "location with free space") from None
    finally:
        try:
            os.unlink(probe)
        except OSError:
            pass


# ------------------------------------------------------------------------------------------ input sample
def _keys_of(record: dict, prefix: str = "", depth: int = 2) -> list:
    keys = []
    for k, v in record.items():
        name = prefix + str(k)
        keys.append(name)
        if isinstance(v, dict) and depth > 1:
            keys.extend(_keys_of(v, name + ".", depth - 1))
    return keys


def sample_text_field(paths, text_field: str, max_line_bytes: int, records: int = SAMPLE_RECORDS,
                      files: int = SAMPLE_FILES) -> Optional[dict]:
    """Read the first records of the first input files; ConfigError when none of them has `text_field`.

    Returns {sampled, with_field} (None when nothing could be sampled: empty or damaged inputs are the
    readers' business, reported as dead letters). Only JSON objects count; damaged lines are skipped.
    """
    sampled, with_field, keys = 0, 0, {}
    for path in list(paths)[:files]:
        try:
            with io_utils.open_read(path) as f:
                scanned_lines = scanned_bytes = 0
                for item in iter_raw_records(f, compression_of(path), max_line_bytes):
                    scanned_lines += 1
                    scanned_bytes += len(getattr(item, "data", b""))
                    if scanned_lines > SAMPLE_SCAN_LINES or scanned_bytes > SAMPLE_SCAN_BYTES:
                        break
                    if isinstance(item, FileDamage) or not item.data.strip():
                        continue
                    try:
                        record = json.loads(item.data)
                    except (ValueError, RecursionError):
                        continue
                    if not isinstance(record, dict):
                        continue
                    sampled += 1
                    result = parse_record(item.data, text_field, ())
                    if getattr(result, "reason", None) not in ("text_missing",):
                        with_field += 1
                    for k in _keys_of(record):
                        keys[k] = keys.get(k, 0) + 1
                    if sampled >= records:
                        break
        except OSError:
            continue
        if sampled >= records:
            break
    if sampled == 0:
        return None
    if with_field == 0:
        seen = ", ".join(sorted(keys, key=lambda k: (-keys[k], k))[:12])
        raise ConfigError(f"--text-field {text_field}: none of the first {sampled} records has it (keys seen: "
                          f"{seen}); pass the field that holds the text, dotted for nested (e.g. --text-field "
                          "content or meta.body)")
    return {"sampled": sampled, "with_field": with_field}


# ------------------------------------------------------------------------------------------ input listing
def skipped_inputs(globs) -> list:
    """Local glob matches that are not readable files: directories and dangling symlinks, as
    [{"path", "reason"}], sorted. (Object stores have neither.)"""
    out = {}
    for pattern in globs:
        if not io_utils.is_local(pattern):
            continue
        for path in glob.glob(pattern, recursive=True):
            if os.path.isdir(path):
                out[path] = "directory"
            elif os.path.islink(path) and not os.path.exists(path):
                out[path] = "dangling_symlink"
    return [{"path": p, "reason": out[p]} for p in sorted(out)]


# ------------------------------------------------------------------------------------------ dead letters
def check_dead_letter_rate(records: dict, max_fraction: float) -> None:
    """RunError when more than `max_fraction` of the records read were dead-lettered (once at least
    DEAD_LETTER_MIN_RECORDS were read), naming the main reasons; the run then commits nothing."""
    read = int(records.get("read", 0))
    dead = records.get("dead_lettered", {}) or {}
    n_dead = sum(dead.values())
    if read < DEAD_LETTER_MIN_RECORDS or n_dead <= max_fraction * read:
        return
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(dead.items(), key=lambda kv: (-kv[1], kv[0]))[:5])
    raise RunError(f"{n_dead} of {read} records ({n_dead / read:.1%}) were dead-lettered, more than "
                   f"--max-dead-letter-fraction {max_fraction} ({reasons}); nothing was committed. Check "
                   "--text-field and the inputs, or raise the limit")


# ------------------------------------------------------------------------------------------ integrity
def damaged_files(output: str, manifest: Manifest) -> list:
    """Files the manifest names that are missing or not of their recorded size (shards: `bytes`)."""
    manifest_file = io_utils.join(output, MANIFEST_NAME)
    problems = []
    paths = [(resolve_dataset_path(manifest_file, s.path, "shard path"), s.bytes) for s in manifest.shards]
    paths += [(resolve_dataset_path(manifest_file, d, "dead letter"), None) for d in manifest.dead_letters]
    for path, size in paths:
        try:
            found = FileSystems.match([path])[0].metadata_list
        except Exception:  # noqa: BLE001 - Beam raises BeamIOError for a missing path on some filesystems
            found = []
        found = [m for m in found if m.path.rstrip("/") == path.rstrip("/")] or found[:1]
        if not found:
            problems.append(f"{path}: missing")
        elif size is not None and int(found[0].size_in_bytes) != size:
            problems.append(f"{path}: {found[0].size_in_bytes} bytes, the manifest says {size}")
    return problems


# ------------------------------------------------------------------------------------------ links
LINKS_SHOWN = 3


def links_inside(root: str, limit: int = LINKS_SHOWN) -> list:
    """The first `limit` symbolic links under the local directory `root`, as sorted paths relative to it. Entries
    are judged by their own type (scandir's d_type, lstat when the filesystem gives none), never by what a link
    points to, and no link is entered; `root` itself may be a link (the operator named it)."""
    found, stack = [], [""]
    while stack and len(found) < limit:
        rel = stack.pop()
        try:
            with os.scandir(os.path.join(root, rel) if rel else root) as it:
                entries = sorted(it, key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):  # removed meanwhile, or `root` is no directory
            continue
        for entry in reversed(entries):  # depth first, in name order
            path = f"{rel}/{entry.name}" if rel else entry.name
            if entry.is_symlink():
                found.append(path)
            elif entry.is_dir(follow_symlinks=False):
                stack.append(path)
    return sorted(found)[:limit]


def check_no_links_inside(root: str, flag: str = "") -> None:
    """ConfigError (exit 2, one line) when a local output or dataset holds a symbolic link anywhere inside: a
    generation directory, a generation manifest, a shard, the live manifest, `generations/`, `.refs/`,
    `_staging/`. Reading through one reads another file than the dataset's, and writing or removing through one
    changes files the command did not create (docs/wip/hostile-review-issue28.md F6). Object stores have none."""
    if not root or not io_utils.is_local(root) or not os.path.isdir(root):
        return
    links = links_inside(root, LINKS_SHOWN + 1)
    if links:
        shown = ", ".join(links[:LINKS_SHOWN]) + (" and more" if len(links) > LINKS_SHOWN else "")
        raise ConfigError(f"{flag + ' ' if flag else ''}{root}: {shown} is a symbolic link; pileprep never reads, "
                          f"writes or removes through a link inside an output (that would touch files elsewhere): "
                          f"replace it with what it points to, or remove it")


# ------------------------------------------------------------------------------------------ staging
def normal_path(path: str) -> str:
    """A comparable form of a path: resolved (symlinks, `..`) for local paths, slash-normalised for URLs."""
    if io_utils.is_local(path):
        return os.path.realpath(os.path.abspath(path))
    scheme, rest = path.split("://", 1)
    parts = [p for p in rest.split("/") if p not in ("", ".")]
    return scheme + "://" + "/".join(parts)


DEFAULT_STAGING_NAME = "_staging"


def staging_root(output: str, staging_dir: Optional[str]) -> str:
    """The one staging-root rule: `--staging-dir`, else `<output>/_staging`."""
    return staging_dir or io_utils.join(output, DEFAULT_STAGING_NAME)


def output_id(output: str) -> str:
    """8 hex digits naming an output (its resolved path or normalised URL): staging belongs to one output."""
    return hashlib.sha256(normal_path(output).encode("utf-8")).hexdigest()[:8]


def staging_dir_for(output: str, staging_dir: Optional[str], generation: str) -> str:
    """This run's staging directory, `<generation>.<output id>` under the staging root: two outputs that share
    one --staging-dir (and, with equal configs and inputs, one generation name) never share a staging dir."""
    return io_utils.join(staging_root(output, staging_dir), f"{generation}.{output_id(output)}")


_STAGING_NAME = re.compile(r"gen-[0-9a-f]{16}(\.[0-9a-f]{8})?")
# A temp manifest a killed commit left (transforms/io/io_utils.py: replace_atomically's mkstemp name, or an
# atomic writer's part file); only ever removed under the output's lock.
_TEMP_MANIFEST = re.compile(re.escape("." + MANIFEST_NAME) + r"\.(.+\.tmp|[0-9a-f]{12}\.part)")


def is_staging_name(name) -> bool:
    return isinstance(name, str) and _STAGING_NAME.fullmatch(name) is not None


# ------------------------------------------------------------------------------------------ leftovers
def mark_staging(staging_dir: str, output: str, generation: str) -> None:
    """Say whose staging this is, so that the next run on `output` recognises it if this one dies."""
    io_utils.write_bytes(io_utils.join(staging_dir, STAGING_MARKER), (json.dumps(
        {"output": output, "generation": generation, "pid": os.getpid(), "started": round(time.time(), 3)},
        sort_keys=True) + "\n").encode("utf-8"))


def cleanup_abandoned(output: str, staging_root: str, committed: Optional[Manifest], keep=()) -> list:
    """Remove what failed runs on `output` left: staging directories under `staging_root` whose marker names
    `output`, and generation directories the committed manifest does not reference. Call only while holding
    the output's lock (then no other run is writing either). Returns the removed paths."""
    removed = []
    live = integrity.referenced_generations(committed) | set(keep)
    resumable = set()
    try:
        markers = FileSystems.match([io_utils.join(staging_root, "*", STAGING_MARKER)])[0].metadata_list
    except Exception:  # noqa: BLE001 - nothing staged
        markers = []
    for m in markers:
        directory = m.path[: -len(STAGING_MARKER)].rstrip("/")
        name = directory.rsplit("/", 1)[-1]
        try:
            owner = json.loads(io_utils.read_bytes(m.path).decode("utf-8")).get("output")
        except (OSError, ValueError):
            continue
        if owner == output and is_staging_name(name):
            generation = _resumable_generation(directory, output, name)
            if generation is not None and generation not in live:
                resumable.add(generation)  # kept with its partial generation for the next run to judge
                continue
            io_utils.delete_tree(directory)
            removed.append(directory)
    live |= resumable
    if io_utils.is_local(output):
        names = os.listdir(output) if os.path.isdir(output) else []
    else:
        try:
            listed = FileSystems.match([io_utils.join(output, "gen-*/*")])[0].metadata_list
        except Exception:  # noqa: BLE001
            listed = []
        prefix = output.rstrip("/") + "/"
        names = {m.path[len(prefix):].split("/", 1)[0] for m in listed if m.path.startswith(prefix)}
    for name in sorted(names):
        if is_generation_name(name) and name not in live:
            path = io_utils.join(output, name)
            io_utils.delete_tree(path)
            removed.append(path)
        elif io_utils.is_local(output) and _TEMP_MANIFEST.fullmatch(name):
            path = os.path.join(output, name)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            removed.append(path)
    return removed


def _resumable_generation(directory: str, output: str, name: str) -> Optional[str]:
    """The generation a staging's resume record names, when it is `output`'s and matches the staging's name."""
    try:
        record = json.loads(io_utils.read_bytes(io_utils.join(directory, RESUME_RECORD)).decode("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    generation = record.get("generation")
    if record.get("output") != output or not isinstance(generation, str) or not name.startswith(generation + "."):
        return None
    return generation if is_generation_name(generation) else None
