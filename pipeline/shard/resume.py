"""Resuming a killed shard run from the finished work its staging holds (docs/OPERATIONS.md "Resume"): the
driver's side. The markers themselves (names, files, write, read, check) are pipeline/shard/markers.py.

A run's staging directory is named by its generation, the fingerprint of config + tokenizer + input ledger,
and by the output (pipeline/ops/guards.py: staging_dir_for). Besides the work files and their completion
markers it holds resume.json, {output, generation, inputs}: whose staging it is, over which ledger rows (path,
bytes, mtime / ETag), written before any work (`write_resume_record`).

The driver checks every marker before the pipeline starts (`reconcile`: names, fingerprint, ledger, sizes);
workers reuse only what the plan lists (pipeline/shard/stage_dofn.py). A packed shard's marker fingerprint names
the config, the tokenizer, the input ledger and, for an incremental run, the committed generation it adds to, so
the shard it describes is the one this run would write (same bytes). After a failure the driver itself sees,
`keep_finished` keeps exactly the marked work, in staging and in the partial generation, and removes everything
else. The ledger row (path, bytes, mtime / ETag) only names an input: before reusing anything, `reconcile`
compares every input's full sha256 with the one recorded when it was first cut (pipeline/shard/input_digests.py),
and nothing is written or reused through a symbolic link.
"""
from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

from apache_beam.io.filesystems import FileSystems

from pipeline.ops import commit, guards, progress
from pipeline.shard import input_digests, markers
from pipeline.shard.markers import NEAR_DEDUP
from transforms.io import io_utils
from transforms.shard.records import BadRecord

LOG = logging.getLogger("pileprep.resume")
RESUME_FILE = guards.RESUME_RECORD
CHECK_THREADS = 8  # one stat per file: on an object store the driver waits on round trips, not on a core
NOTES_SHOWN = 5


@dataclass(frozen=True)
class Resumed:
    """What the driver found reusable: marker names (`cut-f…`, `unit-f…`, `pack-…`) and the one-line notes it
    logged."""
    cuts: frozenset[str] = frozenset()
    units: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()
    packs: frozenset[str] = frozenset()
    near_dedup: bool = False  # the near-dedup stage's staged removals and published files

    def to_event(self) -> dict:
        # "splits_reusable": the run log's key since before "split" meant train/val/test only (docs/OPERATIONS.md)
        return {"splits_reusable": len(self.cuts), "units_reusable": len(self.units),
                "shards_reusable": len(self.packs), "near_dedup_reusable": self.near_dedup,
                "notes": list(self.notes)}


# ------------------------------------------------------------------------------------- whose staging
def resume_record(plan) -> dict:
    return {"output": plan.config.output, "generation": plan.generation, "inputs": [dict(r) for r in plan.input_rows]}


def write_resume_record(plan) -> None:
    io_utils.write_bytes(io_utils.join(plan.staging_dir, RESUME_FILE),
                         json.dumps(resume_record(plan), sort_keys=True).encode("utf-8"))


def read_resume_record(staging_dir: str) -> Optional[dict]:
    try:
        rec = json.loads(io_utils.read_bytes(io_utils.join(staging_dir, RESUME_FILE)))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def resumable_stagings(output: str, staging_root: str) -> dict:
    """{staging dir: generation} of the stagings under `staging_root` that a killed run on `output` left with a
    resume record (pipeline/ops/guards.py cleanup_abandoned keeps these for the next run to judge)."""
    try:
        found = FileSystems.match([io_utils.join(staging_root, "*", RESUME_FILE)])[0].metadata_list
    except Exception:  # noqa: BLE001 - nothing staged
        found = []
    out = {}
    for m in found:
        directory = m.path[: -len(RESUME_FILE)].rstrip("/")
        rec = read_resume_record(directory)
        generation = rec.get("generation") if rec else None
        owner = rec.get("output") if rec else None
        if (isinstance(owner, str) and guards.normal_path(owner) == guards.normal_path(output)
                and guards.is_staging_name(directory.rsplit("/", 1)[-1])
                and isinstance(generation, str) and directory.rsplit("/", 1)[-1].startswith(generation + ".")):
            out[directory] = generation
    return out


def _mismatch(plan, staging_dir: str, enabled: bool) -> Optional[str]:
    """Why the staging at `staging_dir` cannot be resumed by this plan; None when it can."""
    if guards.normal_path(staging_dir) != guards.normal_path(plan.staging_dir):  # "out" and "./out/" alike
        return "another fingerprint (config, tokenizer or input ledger) than this run's " + plan.generation
    if not enabled:
        return "--no-resume"
    rec = read_resume_record(staging_dir) or {}
    if rec.get("generation") != plan.generation:
        return "its resume record names another generation"
    if rec.get("inputs") != resume_record(plan)["inputs"]:
        return "the input ledger changed (an input file's size, mtime or ETag)"
    links = io_utils.links_below(plan.config.output, plan.data_dir) + io_utils.links_below(
        guards.staging_root(plan.config.output, plan.config.staging_dir), staging_dir)
    if links:  # its work would be written (and removed) wherever the link points: never through a link
        return f"{links[0]} is a symbolic link"
    return None


def _discard_staging(staging_dir: str, data_dir: Optional[str]) -> None:
    io_utils.delete_tree(staging_dir)
    io_utils.delete_tree(progress.marker_dir(staging_dir))
    if data_dir is not None:
        io_utils.delete_tree(data_dir)


def reconcile(plan, enabled: bool = True, live=frozenset()) -> Resumed:
    """On the driver, under the output's lock, before any work: keep what this run can reuse, discard the rest.

    Every resumable staging of this output other than this plan's (another fingerprint), and this plan's when
    resuming is off or its input ledger changed, is removed with its partial generation directory (never a
    generation in `live`, the committed ones). In the kept staging, each completion marker is checked
    (`check_marker`: names, fingerprint, ledger, sizes; the worker that reuses it checks the sha256); a marker
    that fails is removed, its work is redone. One note per discarded staging
    and per discarded marker (the first NOTES_SHOWN, then a count) goes to the log's warnings (stderr).
    """
    output = plan.config.output
    root = guards.staging_root(output, plan.config.staging_dir)
    notes = []
    kept = False
    for staging_dir, generation in sorted(resumable_stagings(output, root).items()):
        why = _mismatch(plan, staging_dir, enabled)
        if why is None:
            kept = True
            continue
        data_dir = None if generation in live else io_utils.join(output, generation)
        _discard_staging(staging_dir, data_dir)
        notes.append(f"resume: discarded the staging {staging_dir} of an earlier run ({why})")
    if not kept:
        for note in notes:
            LOG.warning("%s", note)
        return Resumed(notes=tuple(notes))
    commit.remove_temp_files(plan.staging_dir)
    commit.remove_temp_files(plan.data_dir)
    io_utils.delete_tree(progress.marker_dir(plan.staging_dir))  # counters start again; reused work re-counts
    names = markers.marker_names(plan.staging_dir)

    def check(name):
        try:  # the near-dedup stage's files are read by no worker that could check them: sha256 here
            return name, markers.check_marker(plan, name, hashes=name == NEAR_DEDUP), None
        except BadRecord as e:
            return name, None, str(e)

    with ThreadPoolExecutor(CHECK_THREADS) as pool:
        results = list(pool.map(check, names))
    bad = [(n, why) for n, _marker, why in results if why is not None]
    for name, _why in bad:
        markers.delete_file(markers.marker_path(plan.staging_dir, name))
    notes += [f"resume: discarded the finished {n} ({why}); it is redone" for n, why in bad[:NOTES_SHOWN]]
    if len(bad) > NOTES_SHOWN:
        notes.append(f"resume: discarded {len(bad) - NOTES_SHOWN} more finished units; they are redone")
    # The inputs' content, not their (path, size, mtime): pipeline/shard/input_digests.py
    screened = input_digests.screen(plan, {n: marker for n, marker, why in results if why is None})
    for name in sorted(screened.discard):
        markers.delete_file(markers.marker_path(plan.staging_dir, name))
    notes += list(screened.notes)
    good = [n for n, _marker, why in results if why is None and n not in screened.discard]
    resumed = Resumed(frozenset(n for n in good if n.startswith("cut-")),
                      frozenset(n for n in good if n.startswith("unit-")), tuple(notes),
                      frozenset(n for n in good if n.startswith("pack-")), NEAR_DEDUP in good)
    for note in notes:
        LOG.warning("%s", note)
    LOG.info("resume: %d cut input file(s), %d tokenized unit(s) and %d packed shard(s) of an earlier run are "
             "reused%s", len(resumed.cuts), len(resumed.units), len(resumed.packs),
             ", and its near-dedup stage" if resumed.near_dedup else "")
    return resumed


@dataclass(frozen=True)
class Kept:
    """What a failed run kept for the next one (`keep_finished`)."""
    units: int = 0
    cuts: int = 0
    shards: int = 0
    near_dedup: bool = False

    def __bool__(self) -> bool:
        return bool(self.units or self.cuts or self.shards or self.near_dedup)

    def describe(self) -> str:
        """'3 finished units and 2 packed shards', for the CLI's one line ('' for nothing)."""
        parts = [f"{n} {what}{'s' * (n != 1)}" for n, what in ((self.units, "finished unit"),
                                                                 (self.shards, "packed shard")) if n]
        parts += ["the near-dedup stage"] if self.near_dedup else []
        if not parts and self.cuts:
            parts = [f"{self.cuts} cut input file{'s' * (self.cuts != 1)}"]
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def keep_finished(plan) -> Kept:
    """After a failure the driver sees itself (a worker exception, ENOSPC, SIGINT / SIGTERM), its workers
    stopped: keep only the finished work the next run can reuse, as a SIGKILL would have, but with nothing
    half-written beside it.

    Kept: `resume.json`, the staging marker (pipeline/ops/guards.py cleanup_abandoned finds the staging by it,
    and keeps the partial generation beside a resumable staging) and each completion marker that still checks
    (`check_marker`, sizes) with the files it names: in staging, and in the partial generation (a packed shard,
    a unit's dead letters); and the failed-backend records (`mark_backend_failed`). A failed backend's units are
    kept as they are (the issue-28 message says so), but the next run never picks that backend, so `reconcile`
    discards them with a note (`_read_marker`: another backend key). Removed: everything else in both
    (in-progress units and chunks, temp files, the staged model, shards without a marker, the progress marker
    dir). When neither a marker nor a record is left, the staging and the partial
    generation go entirely. The next run judges what is kept like a killed run's staging (`reconcile`),
    so another config or a changed input ledger still discards it with a note."""
    staging, data = plan.staging_dir, plan.data_dir
    io_utils.delete_tree(progress.marker_dir(staging))
    names = markers.marker_names(staging)
    keep = {io_utils.join(staging, RESUME_FILE), io_utils.join(staging, guards.STAGING_MARKER)}
    # A spot-check failure record outlives the run: the next run's plan reads it (markers.py failed_backends), so it
    # never picks that backend again.
    records = markers.failed_backend_records(staging)
    keep.update(records)
    counts = {"unit-": 0, "cut-": 0, "pack-": 0, "near-": 0}
    for name in names:
        try:
            marker = markers.check_marker(plan, name)
        except BadRecord:
            continue
        keep.add(markers.marker_path(staging, name))
        if name.startswith(("unit-f", "cut-f")):  # its input's recorded sha256 (pipeline/shard/input_digests.py)
            keep.add(input_digests.record_path(staging, int(name.split("-f", 1)[1][:6])))
        keep.update(markers.file_path(plan, r) for r in marker["files"])
        counts[name[: name.index("-") + 1]] += 1
    kept = Kept(counts["unit-"], counts["cut-"], counts["pack-"], bool(counts["near-"]))
    if not kept and not records:
        io_utils.delete_tree(staging)
        io_utils.delete_tree(data)
        return kept
    for path in _staging_files(staging) + _staging_files(data):
        if path not in keep:
            markers.delete_file(path)
    return kept


def _staging_files(staging_dir: str) -> list:
    """Every file under `staging_dir` (or a partial generation), as io_utils.join names them."""
    if io_utils.is_local(staging_dir):
        return [io_utils.join(staging_dir, os.path.relpath(os.path.join(d, n), staging_dir).replace(os.sep, "/"))
                for d, _dirs, files in os.walk(staging_dir) for n in files]
    try:
        return [m.path for m in FileSystems.match([io_utils.join(staging_dir, "**")])[0].metadata_list]
    except Exception:  # noqa: BLE001 - an object store shows no part-written object: what is not listed stays
        return []


