"""Resuming a killed shard run from the finished work its staging holds (docs/OPERATIONS.md "Resume").

A run's staging directory is named by its generation, the fingerprint of config + tokenizer + input ledger,
and by the output (pipeline/ops/guards.py: staging_dir_for). Besides the work files it holds:

  resume.json                      {output, generation, inputs}: whose staging it is, over which ledger rows
                                   (path, bytes, mtime / ETag), written before any work
  done/cut-f000003.json            one completion marker per cut input file, per tokenized unit and per
  done/unit-f000003-c00012.json    packed shard, written last (temp + rename, transforms/io/io_utils.py
  done/pack-train-00003-of-00013.json  open_write): the stage's result and the size + sha256 of every file it
                                   wrote (a packed shard lives in the run's partial generation, which no
                                   manifest names until the commit; its kept-ids file in staging)
  failed-backends/<key hash>.json  {backend}: a fast tokenizer backend that failed a spot check in a run of
                                   this generation (`mark_backend_failed`); kept by `keep_finished`, so the next
                                   run never picks it again (pipeline/shard/plan.py) nor reuses its units

Units depend only on the inputs and --unit-mb (pipeline/shard/unit_plan.py subdivides --unit-mb for a small
input from the ledger alone; transforms/shard/cut.py cuts), never on the worker count, so
markers survive a rerun on another runner or worker count. The driver checks every marker
before the pipeline starts (`reconcile`: names, fingerprint, ledger, sizes); workers reuse only what the plan
lists, after checking the sha256 of its files (`load_cut`, `load_unit`), and mark what they finish
(`mark_cut`, `mark_unit`, `mark_pack`). A packed shard is reused the same way (`load_pack`): its
marker's fingerprint names the config, the tokenizer, the input ledger and, for an incremental run, the
committed generation it adds to, so the shard it describes is the one this run would write (same bytes).
After a failure the driver itself sees, `keep_finished` keeps exactly the marked work, in staging and in the
partial generation, and removes everything else. The ledger row (path, bytes, mtime / ETag) only names an
input: before reusing anything, `reconcile` compares every input's full sha256 with the one recorded when it was
first cut (pipeline/shard/input_digests.py), and nothing is written or reused through a symbolic link.

Markers and results are JSON, never pickles: a marker is data read back from a directory another process
wrote, so every field is type-checked and every file it names must be the one its unit would write.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from model_contract.hashing import sha256_file
from pipeline.ops import guards, progress
from pipeline.shard import input_digests
from pipeline.shard.near_dedup import settings as near_dedup_settings
from transforms.io import io_utils
from transforms.shard import layout
from transforms.shard.layout import DATA, STAGING, Layout
from transforms.shard.records import BadRecord, CutOutput, ShardResult, ShardTask, UnitResult

LOG = logging.getLogger("pileprep.resume")
RESUME_FILE = guards.RESUME_RECORD
DONE_DIR = "done"
_PACK_NAME = re.compile(r"pack-(train|val|test)-[0-9]{5}-of-[0-9]{5}")
NEAR_DEDUP = "near-dedup"  # the global stage's one marker (its clusters need every unit: docs/OPERATIONS.md)
_MARKER_NAME = re.compile(r"(cut-f[0-9]{6}|unit-f[0-9]{6}-c[0-9]{5}|pack-(train|val|test)-[0-9]{5}-of-[0-9]{5}"
                          r"|near-dedup)\.json")
# What the near-dedup stage writes (pipeline/shard/near_dedup/partitions.py finish): removal indexes and their list in
# staging; the summary, removed-id sidecars and band indexes in the partial generation. One directory level.
_NEAR_DEDUP_FILE = re.compile(r"near-dedup/[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")
# What a killed writer leaves (transforms/io/io_utils.py: _LocalAtomicWriter's and replace_atomically's names)
_TEMP_NAME = re.compile(r"\..+\.[0-9a-f]{12}\.(part|tmp)")
CHECK_THREADS = 8  # one stat per file: on an object store the driver waits on round trips, not on a core
NOTES_SHOWN = 5


@dataclass(frozen=True)
class Resumed:
    """What the driver found reusable: marker names (`cut-f…`, `unit-f…`, `pack-…`) and the one-line notes it
    logged."""
    cuts: frozenset = frozenset()
    units: frozenset = frozenset()
    notes: tuple = ()
    packs: frozenset = frozenset()
    near_dedup: bool = False  # the near-dedup stage's staged removals and published files

    def to_event(self) -> dict:
        # "splits_reusable": the run log's key since before "split" meant train/val/test only (docs/OPERATIONS.md)
        return {"splits_reusable": len(self.cuts), "units_reusable": len(self.units),
                "shards_reusable": len(self.packs), "near_dedup_reusable": self.near_dedup,
                "notes": list(self.notes)}


# ------------------------------------------------------------------------------------------- names, files
def cut_marker_name(file_idx: int) -> str:
    return f"cut-f{file_idx:06d}"


def unit_marker_name(unit_name: str) -> str:
    return "unit-" + unit_name


def pack_marker_name(task: ShardTask) -> str:
    return "pack-" + task.file_name[: -len(".tfrecord")]


def marker_path(staging_dir: str, name: str) -> str:
    return io_utils.join(staging_dir, DONE_DIR, name + ".json")


def _root_path(root: str, staging_dir: str, data_dir: str, rel: str) -> str:
    return Layout(staging_dir, data_dir).path(layout.Placed(root, rel))


def _unit_files(name: str, dead_letter: bool, signed: bool = False) -> list:
    """(root, relative path) of every file tokenize_chunk writes for unit `name`
    (transforms/shard/tokenize_unit.py): with `signed`, the near-dedup signatures it staged too (`signs_units`)."""
    files = [layout.unit_index(name), layout.unit_tokens(name)]
    files += [layout.unit_signatures(name)] if signed else []
    return files + ([layout.unit_dead_letters(name)] if dead_letter else [])


def signs_units(plan) -> bool:
    """Whether this run's tokenize stage stages near-dedup signatures per unit (near_dedup_settings.tokenize_signing):
    decided by the config, so by the fingerprint every marker carries."""
    config = plan.config
    return bool(getattr(config, "near_dedup", False)) and near_dedup_settings.tokenize_signing(config) is not None


def _cut_files(file_idx: int, chunks: int, dead_letter: bool, spilled: bool = True) -> list:
    """(root, relative path) of every file the cut of input file `file_idx` writes: its chunk files when they
    were spilled (transforms/shard/cut.py cut_input_file), its dead letters."""
    files = [layout.chunk_file(layout.unit_name_of(file_idx, i)) for i in range(chunks if spilled else 0)]
    return files + ([layout.cut_dead_letters(file_idx)] if dead_letter else [])


def _pack_files(file_name: str) -> list:
    """(root, relative path) of every file pack_shard writes for shard `file_name` (transforms/shard/pack.py):
    the shard in the partial generation, the ids it kept in staging."""
    return [layout.shard_file(file_name), layout.shard_ids(file_name)]


# ------------------------------------------------------------------------------------------ the markers
def _file_rows(files: list, staging_dir: str, data_dir: str, known: Optional[dict] = None) -> list:
    """{root, path, bytes, sha256} per file. `known`: {(root, path): (bytes, sha256)} its writer computed as it
    wrote (a packed shard's HashingWriter), not read back: that re-read was ~3% of the 384 MB job's CPU."""
    rows = []
    for root, rel in files:
        if known and (root, rel) in known:
            size, sha = known[(root, rel)]
        else:
            size, sha = sha256_file(_root_path(root, staging_dir, data_dir, rel), opener=io_utils.open_read)
        rows.append({"root": root, "path": rel, "bytes": size, "sha256": sha})
    return rows


def backend_key(plan) -> str:
    """What about the tokenizer backend decides the bytes of a unit (and of everything made from units): its
    name, versions and proven-equal domain (transforms/tokenize/tokenizer_backends.py BackendChoice.resume_key).
    Not in the generation's fingerprint (shards are byte-identical across exact backends), so it is in every
    marker but a cut's, and a marker of another backend is never reused."""
    choice = getattr(plan, "tokenizer_backend", None)
    return "" if choice is None else choice.resume_key


FAILED_BACKENDS_DIR = "failed-backends"


def mark_backend_failed(plan) -> None:
    """A spot check of this run's fast backend failed: recorded in the staging, so no later run of this
    generation reuses a unit it produced (`_read_marker`) or picks it again (plan.py `failed_backends`)."""
    key = backend_key(plan)
    name = hashlib.sha256(key.encode("utf-8")).hexdigest()[:32] + ".json"
    io_utils.write_bytes(io_utils.join(plan.staging_dir, FAILED_BACKENDS_DIR, name),
                         json.dumps({"backend": key}, sort_keys=True).encode("utf-8"))


def _failed_backend_records(staging_dir: str) -> list:
    """The paths of the records `mark_backend_failed` wrote in this staging."""
    try:
        found = FileSystems.match([io_utils.join(staging_dir, FAILED_BACKENDS_DIR, "*.json")])[0].metadata_list
    except Exception:  # noqa: BLE001 - no staging, no record
        return []
    return [m.path for m in found]


def failed_backends(staging_dir: str) -> frozenset:
    """The backend keys recorded by `mark_backend_failed` in this staging (none when there is no staging)."""
    keys = set()
    for path in _failed_backend_records(staging_dir):
        try:
            rec = json.loads(io_utils.read_bytes(path))
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("backend"), str):
            keys.add(rec["backend"])
    return frozenset(keys)


def _write_marker(staging_dir: str, data_dir: str, generation: str, name: str, record: dict, files: list,
                  known: Optional[dict] = None, backend: str = "") -> None:
    marker = {"fingerprint": generation, "name": name, "result": record,
              "files": _file_rows(files, staging_dir, data_dir, known)}
    if not name.startswith("cut-"):
        marker["backend"] = backend
    io_utils.write_bytes(marker_path(staging_dir, name), json.dumps(marker, sort_keys=True).encode("utf-8"))


def mark_unit(plan, unit: UnitResult) -> None:
    """After every file of the unit is written: its completion marker, last."""
    _write_marker(plan.staging_dir, plan.data_dir, plan.generation, unit_marker_name(unit.name), unit.to_json(),
                  _unit_files(unit.name, unit.dead_letter_path is not None, signs_units(plan)),
                  backend=backend_key(plan))


def mark_cut(plan, out: CutOutput) -> None:
    r = out.result
    _write_marker(plan.staging_dir, plan.data_dir, plan.generation, cut_marker_name(r.file_idx), out.to_json(),
                  _cut_files(r.file_idx, len(r.chunks), r.dead_letter_path is not None, r.spilled))


def mark_pack(plan, result: ShardResult) -> None:
    """After the shard and its kept-ids file are written: its completion marker, last."""
    _write_marker(plan.staging_dir, plan.data_dir, plan.generation, pack_marker_name(result.task),
                  result.to_json(), _pack_files(result.task.file_name),
                  known={(DATA, result.task.file_name): (result.bytes, result.sha256)}, backend=backend_key(plan))


def mark_near_dedup(plan, staged: list, published: list) -> None:
    """After the near-dedup stage's last file (its removals list, pipeline/shard/near_dedup/partitions.py finish):
    its marker, naming every file it wrote, `staged` under the staging directory and `published` under the
    partial generation (full paths)."""
    def rel(path, root):
        prefix = root.rstrip("/") + "/"
        if not path.startswith(prefix):
            raise ValueError(f"{path} is not under {root}")
        return path[len(prefix):]

    files = sorted({(STAGING, rel(p, plan.staging_dir)) for p in staged} |
                   {(DATA, rel(p, plan.data_dir)) for p in published})
    _write_marker(plan.staging_dir, plan.data_dir, plan.generation, NEAR_DEDUP, {"stage": NEAR_DEDUP}, files,
                  backend=backend_key(plan))


def _read_marker(plan, name: str) -> dict:
    try:
        marker = json.loads(io_utils.read_bytes(marker_path(plan.staging_dir, name)))
    except (OSError, ValueError) as e:
        raise BadRecord(f"unreadable ({type(e).__name__})") from None
    if not isinstance(marker, dict) or not isinstance(marker.get("result"), dict):
        raise BadRecord("not a marker")
    if marker.get("fingerprint") != plan.generation:
        raise BadRecord(f"fingerprint {str(marker.get('fingerprint'))[:40]!r} is not this run's {plan.generation}")
    if marker.get("name") != name:
        raise BadRecord("its name does not match its file name")
    if not name.startswith("cut-"):
        made_by = marker.get("backend")
        if made_by != backend_key(plan):
            # a backend that failed a spot check is never this run's (plan.py passes failed_backends to the
            # choice), so its units are discarded here too
            raise BadRecord(f"made by tokenizer backend {str(made_by)[:80]!r}, not this run's")
    return marker


def load_unit(plan, unit_name: str) -> Optional[UnitResult]:
    """A reusable unit's result, its files' sha256 checked here; None (with the note) when one does not match."""
    marker = _checked_on_worker(plan, unit_marker_name(unit_name))
    return None if marker is None else UnitResult.from_json(marker["result"], Layout(plan.staging_dir, plan.data_dir))


def load_pack(plan, task: ShardTask) -> Optional[ShardResult]:
    """A reusable packed shard's result (its files' sha256 checked here); None when it is not reusable."""
    marker = _checked_on_worker(plan, pack_marker_name(task))
    if marker is None:
        return None
    result = ShardResult.from_json(marker["result"], Layout(plan.staging_dir, plan.data_dir))
    if result.task != task:
        LOG.warning("resume: discarded the finished %s (it describes another shard); it is redone",
                    pack_marker_name(task))
        return None
    return result


def pack_once(plan, task: ShardTask, pack) -> Optional[ShardResult]:
    """An earlier run's shard when the driver found its marker and its files still check, else `pack()` (None
    when the driver cancelled the run), marked once written; counted either way. The packers of both shuffles
    (pipeline/shard/shard_pipeline.py PackShard, pipeline/shard/runner_shuffle.py PackGroupedShard) call this."""
    reused = None
    if pack_marker_name(task) in plan.resumed_packs:
        reused = load_pack(plan, task)
    result = reused if reused is not None else pack()
    if result is None:
        return None
    if reused is None:
        mark_pack(plan, result)
    count_packed(plan, result, reused is not None)
    return result


def count_packed(plan, result: ShardResult, reused: bool) -> None:
    """A packed shard's counters: Beam's (examples, shards packed or reused) and a progress marker (runners
    without live metrics; pipeline/ops/progress.py)."""
    what = "shards_reused" if reused else "shards_packed"
    Metrics.counter(progress.NAMESPACE, "examples").inc(result.examples)
    Metrics.counter(progress.NAMESPACE, what).inc()
    progress.write_marker(plan.staging_dir, pack_marker_name(result.task), {what: 1})


def load_cut(plan, file_idx: int, spilled: bool = True) -> Optional[CutOutput]:
    """A reusable cut of input file `file_idx` made the way this run needs it (`spilled`: with its chunk files
    in staging, for a tokenize stage that reads them; else with its chunks tokenized as they were cut); None
    otherwise, and the file is cut again."""
    name = cut_marker_name(file_idx)
    try:  # the kind first, from the marker alone: a spilled cut's chunk files are not hashed for nothing
        made_spilled = _read_marker(plan, name)["result"].get("spilled", True)
    except BadRecord:
        made_spilled = spilled  # _checked_on_worker notes why and discards it
    if made_spilled != spilled:
        LOG.info("resume: the finished %s was cut %s chunk files; it is cut again", name,
                 "into" if made_spilled else "without")
        return None
    marker = _checked_on_worker(plan, name)
    return None if marker is None else CutOutput.from_json(marker["result"], Layout(plan.staging_dir, plan.data_dir))


def _checked_on_worker(plan, name: str) -> Optional[dict]:
    """The driver compared sizes only (one stat per file, cheap on S3 too); the sha256 of a reused unit's files is
    checked by the worker that reuses it, so those reads are spread over the workers like the work itself."""
    try:
        return check_marker(plan, name, hashes=True)
    except BadRecord as e:
        LOG.warning("resume: discarded the finished %s (%s); it is redone", name, e)
        _delete_file(marker_path(plan.staging_dir, name))
        return None


def _size(path: str) -> int:
    if io_utils.is_local(path):
        return os.path.getsize(path)
    found = [m for m in FileSystems.match([path])[0].metadata_list if m.path == path]
    if not found:
        raise FileNotFoundError(path)
    return int(found[0].size_in_bytes)


def check_marker(plan, name: str, hashes: bool = False) -> dict:
    """Marker `name`, unless it is not this run's, does not describe the work this plan would do, or a file it
    names is missing or not of its recorded size (with `hashes`, sha256 too): then BadRecord with the reason."""
    marker = _read_marker(plan, name)
    rec = marker["result"]
    if name == NEAR_DEDUP:
        return _check_files(plan, marker, _near_dedup_files(marker), hashes)
    if name.startswith("pack-"):
        shard = ShardResult.from_json(rec, Layout(plan.staging_dir, plan.data_dir))
        if pack_marker_name(shard.task) != name:
            raise BadRecord("the shard it describes has another name")
        return _check_files(plan, marker, _pack_files(shard.task.file_name), hashes)
    if name.startswith("unit-"):
        unit = UnitResult.from_json(rec, Layout(plan.staging_dir, plan.data_dir))
        if unit_marker_name(unit.name) != name:
            raise BadRecord("the unit it describes has another name")
        file_idx, input_path = unit.file_idx, unit.input_path
        expected = _unit_files(unit.name, unit.dead_letter_path is not None, signs_units(plan))
    else:
        cut = CutOutput.from_json(rec, Layout(plan.staging_dir, plan.data_dir))
        file_idx, input_path = cut.result.file_idx, cut.result.input_path
        if cut_marker_name(file_idx) != name:
            raise BadRecord("the input file it describes has another index")
        expected = _cut_files(file_idx, len(cut.result.chunks), cut.result.dead_letter_path is not None,
                              cut.result.spilled)
    if not 0 <= file_idx < len(plan.ledger) or plan.ledger[file_idx].path != input_path:
        raise BadRecord(f"input file #{file_idx} is not {input_path[:200]!r} in this run's ledger")
    return _check_files(plan, marker, expected, hashes)


def _near_dedup_files(marker: dict) -> list:
    """The files a near-dedup marker names, when they are what that stage writes: one level under near-dedup/ in
    staging or in the partial generation, the removals list and the summary among them (never a path elsewhere)."""
    rows = marker.get("files")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise BadRecord("no file list")
    files = [(r.get("root"), r.get("path")) for r in rows]
    for root, path in files:
        if root not in (STAGING, DATA) or not isinstance(path, str) or not _NEAR_DEDUP_FILE.fullmatch(path) \
                or ".." in path:
            raise BadRecord(f"{str(path)[:80]!r} is not a file the near-dedup stage writes")
    if (STAGING, "near-dedup/removals.json") not in files or (DATA, "near-dedup/summary.json") not in files:
        raise BadRecord("its files lack the removals list or the summary")
    return files


def _check_files(plan, marker: dict, expected: list, hashes: bool) -> dict:
    """`marker`, when it lists exactly the `expected` files and each has its recorded size (sha256 too with
    `hashes`); else BadRecord naming the first that does not."""
    rows = marker.get("files")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise BadRecord("no file list")
    if [(r.get("root"), r.get("path")) for r in rows] != expected:
        raise BadRecord("its files are not the ones its unit writes")
    for r in rows:
        path = _root_path(r["root"], plan.staging_dir, plan.data_dir, r["path"])
        try:
            size, sha = sha256_file(path, opener=io_utils.open_read) if hashes else (_size(path), None)
        except OSError:
            raise BadRecord(f"{r['path']} is missing") from None
        if size != r.get("bytes") or (hashes and sha != r.get("sha256")):
            found = f"{size} bytes" + (f", sha256 {sha[:12]}…" if hashes else "")
            raise BadRecord(f"{r['path']} is damaged ({found}; the marker says {r.get('bytes')} bytes, sha256 "
                          f"{str(r.get('sha256'))[:12]}…)")
    return marker


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


def _remove_temp_files(directory: str) -> None:
    """A killed writer's temp files (local only: an object store never shows a part-written object)."""
    if not io_utils.is_local(directory):
        return
    for dirpath, _dirs, names in os.walk(directory):
        for name in names:
            if _TEMP_NAME.fullmatch(name):
                try:
                    os.unlink(os.path.join(dirpath, name))
                except FileNotFoundError:
                    pass


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
    _remove_temp_files(plan.staging_dir)
    _remove_temp_files(plan.data_dir)
    io_utils.delete_tree(progress.marker_dir(plan.staging_dir))  # counters start again; reused work re-counts
    try:
        found = FileSystems.match([io_utils.join(plan.staging_dir, DONE_DIR, "*.json")])[0].metadata_list
    except Exception:  # noqa: BLE001 - no marker yet
        found = []
    names = sorted(m.path.rsplit("/", 1)[-1] for m in found)
    names = [n[: -len(".json")] for n in names if _MARKER_NAME.fullmatch(n)]

    def check(name):
        try:  # the near-dedup stage's files are read by no worker that could check them: sha256 here
            return name, check_marker(plan, name, hashes=name == NEAR_DEDUP), None
        except BadRecord as e:
            return name, None, str(e)

    with ThreadPoolExecutor(CHECK_THREADS) as pool:
        results = list(pool.map(check, names))
    bad = [(n, why) for n, _marker, why in results if why is not None]
    for name, _why in bad:
        _delete_file(marker_path(plan.staging_dir, name))
    notes += [f"resume: discarded the finished {n} ({why}); it is redone" for n, why in bad[:NOTES_SHOWN]]
    if len(bad) > NOTES_SHOWN:
        notes.append(f"resume: discarded {len(bad) - NOTES_SHOWN} more finished units; they are redone")
    # The inputs' content, not their (path, size, mtime): pipeline/shard/input_digests.py
    screened = input_digests.screen(plan, {n: marker for n, marker, why in results if why is None})
    for name in sorted(screened.discard):
        _delete_file(marker_path(plan.staging_dir, name))
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
    try:
        found = FileSystems.match([io_utils.join(staging, DONE_DIR, "*.json")])[0].metadata_list
    except Exception:  # noqa: BLE001 - nothing marked
        found = []
    names = [n[: -len(".json")] for n in sorted(m.path.rsplit("/", 1)[-1] for m in found) if _MARKER_NAME.fullmatch(n)]
    keep = {io_utils.join(staging, RESUME_FILE), io_utils.join(staging, guards.STAGING_MARKER)}
    # A spot-check failure record outlives the run: the next run's plan reads it (plan.py failed_backends), so it
    # never picks that backend again. Named as _staging_files names them (a match may return another spelling).
    records = [io_utils.join(staging, FAILED_BACKENDS_DIR, p.rsplit("/", 1)[-1])
               for p in _failed_backend_records(staging)]
    keep.update(records)
    counts = {"unit-": 0, "cut-": 0, "pack-": 0, "near-": 0}
    for name in names:
        try:
            marker = check_marker(plan, name)
        except BadRecord:
            continue
        keep.add(marker_path(staging, name))
        if name.startswith(("unit-f", "cut-f")):  # its input's recorded sha256 (pipeline/shard/input_digests.py)
            keep.add(input_digests.record_path(staging, int(name.split("-f", 1)[1][:6])))
        keep.update(_root_path(r["root"], staging, data, r["path"]) for r in marker["files"])
        counts[name[: name.index("-") + 1]] += 1
    kept = Kept(counts["unit-"], counts["cut-"], counts["pack-"], bool(counts["near-"]))
    if not kept and not records:
        io_utils.delete_tree(staging)
        io_utils.delete_tree(data)
        return kept
    for path in _staging_files(staging) + _staging_files(data):
        if path not in keep:
            _delete_file(path)
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


def _delete_file(path: str) -> None:
    if io_utils.is_local(path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    elif io_utils.exists(path):
        FileSystems.delete([path])
