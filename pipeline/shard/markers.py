"""Completion markers: the finished work of a shard run, one JSON file per cut input file, tokenized unit and packed
shard (and one for the near-dedup stage), written last, read back by a rerun (pipeline/shard/resume.py).

  done/cut-f000003.json            one marker per cut input file, per tokenized unit and per packed shard,
  done/unit-f000003-c00012.json    written last (temp + rename, transforms/io/io_utils.py open_write): the
  done/pack-train-00003-of-00013.json  stage's result (its record's to_json, transforms/shard/records.py) and the
                                   size + sha256 of every file it wrote (`files`: root + path below it,
                                   transforms/shard/layout.py), and the fingerprint of the run's generation
  done/near-dedup.json             the global near-dedup stage: every file it staged or published
  failed-backends/<key hash>.json  {backend}: a fast tokenizer backend that failed a spot check in a run of
                                   this generation (`mark_backend_failed`): the next run never picks it again
                                   (pipeline/shard/plan.py) nor reuses its units

A marker is data read back from a directory another process wrote, never a pickle: every field is type-checked
(the records' from_json) and every file it names must be the one its work would write (`check_marker`). Names
depend only on the inputs, --unit-mb and the shard plan (pipeline/shard/unit_plan.py), never on the worker
count, so markers survive a rerun on another runner or worker count. Workers reuse a marked result after
checking the sha256 of its files (`load_cut`, `load_unit`, `load_pack`; the driver checked sizes only) and mark
what they finish (`mark_cut`, `mark_unit`, `mark_pack`) through pipeline/shard/stage_dofn.py.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from typing import Optional

from apache_beam.io.filesystems import FileSystems

from model_contract.hashing import sha256_file
from pipeline.shard.near_dedup import settings as near_dedup_settings
from transforms.io import io_utils
from transforms.shard import layout
from transforms.shard.layout import DATA, STAGING, Layout, Placed
from transforms.shard.records import BadRecord, CutOutput, ShardResult, ShardTask, UnitResult

LOG = logging.getLogger("pileprep.resume")
NEAR_DEDUP = "near-dedup"  # the global stage's one marker (its clusters need every unit: docs/OPERATIONS.md)
_MARKER_NAME = re.compile(r"(cut-f[0-9]{6}|unit-f[0-9]{6}-c[0-9]{5}|pack-(train|val|test)-[0-9]{5}-of-[0-9]{5}"
                          r"|near-dedup)")
# What the near-dedup stage writes (pipeline/shard/near_dedup/partitions.py finish): removal indexes and their list in
# staging; the summary, removed-id sidecars and band indexes in the partial generation. One directory level.
_NEAR_DEDUP_FILE = re.compile(r"near-dedup/[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")


# ------------------------------------------------------------------------------------------- names, files
def cut_marker_name(file_idx: int) -> str:
    return f"cut-f{file_idx:06d}"


def unit_marker_name(unit_name: str) -> str:
    return "unit-" + unit_name


def pack_marker_name(task: ShardTask) -> str:
    return "pack-" + task.file_name[: -len(".tfrecord")]


def marker_path(staging_dir: str, name: str) -> str:
    return Layout(staging_dir, "").path(layout.marker(name))


def marker_names(staging_dir: str) -> list[str]:
    """The names of the completion markers in a staging directory, sorted (none when there is no staging)."""
    try:
        found = FileSystems.match([marker_path(staging_dir, "*")])[0].metadata_list
    except Exception:  # noqa: BLE001 - no marker yet
        found = []
    names = sorted(m.path.rsplit("/", 1)[-1][: -len(".json")] for m in found if m.path.endswith(".json"))
    return [n for n in names if _MARKER_NAME.fullmatch(n)]


def file_path(plan, row: dict) -> str:
    """The full path of a file a marker lists ({root, path, ...})."""
    return Layout(plan.staging_dir, plan.data_dir).path(Placed(row["root"], row["path"]))


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
    wrote (a packed shard's HashingWriter), not read back (what the re-read cost: docs/BENCHMARKS.md, "Measured
    choices in the shard job")."""
    rows = []
    for root, rel in files:
        if known and (root, rel) in known:
            size, sha = known[(root, rel)]
        else:
            size, sha = sha256_file(Layout(staging_dir, data_dir).path(Placed(root, rel)), opener=io_utils.open_read)
        rows.append({"root": root, "path": rel, "bytes": size, "sha256": sha})
    return rows


def backend_key(plan) -> str:
    """What about the tokenizer backend decides the bytes of a unit (and of everything made from units): its
    name, versions and proven-equal domain (transforms/tokenize/tokenizer_backends.py BackendChoice.resume_key).
    Not in the generation's fingerprint (shards are byte-identical across exact backends), so it is in every
    marker but a cut's, and a marker of another backend is never reused."""
    choice = getattr(plan, "tokenizer_backend", None)
    return "" if choice is None else choice.resume_key


def mark_backend_failed(plan) -> None:
    """A spot check of this run's fast backend failed: recorded in the staging, so no later run of this
    generation reuses a unit it produced (`_read_marker`) or picks it again (`failed_backends`, read by plan.py)."""
    key = backend_key(plan)
    name = hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]
    io_utils.write_bytes(Layout(plan.staging_dir, "").path(layout.failed_backend(name)),
                         json.dumps({"backend": key}, sort_keys=True).encode("utf-8"))


def failed_backend_records(staging_dir: str) -> list[str]:
    """The paths of the records `mark_backend_failed` wrote in this staging, named as layout.failed_backend names
    them (a match may return another spelling; pipeline/shard/resume.py keep_finished compares names)."""
    where = Layout(staging_dir, "")
    try:
        found = FileSystems.match([where.path(layout.failed_backend("*"))])[0].metadata_list
    except Exception:  # noqa: BLE001 - no staging, no record
        return []
    return [where.path(layout.failed_backend(m.path.rsplit("/", 1)[-1][: -len(".json")])) for m in found]


def failed_backends(staging_dir: str) -> frozenset:
    """The backend keys recorded by `mark_backend_failed` in this staging (none when there is no staging)."""
    keys = set()
    for path in failed_backend_records(staging_dir):
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
        delete_file(marker_path(plan.staging_dir, name))
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
        path = file_path(plan, r)
        try:
            size, sha = sha256_file(path, opener=io_utils.open_read) if hashes else (_size(path), None)
        except OSError:
            raise BadRecord(f"{r['path']} is missing") from None
        if size != r.get("bytes") or (hashes and sha != r.get("sha256")):
            found = f"{size} bytes" + (f", sha256 {sha[:12]}…" if hashes else "")
            raise BadRecord(f"{r['path']} is damaged ({found}; the marker says {r.get('bytes')} bytes, sha256 "
                          f"{str(r.get('sha256'))[:12]}…)")
    return marker


def delete_file(path: str) -> None:
    if io_utils.is_local(path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    elif io_utils.exists(path):
        FileSystems.delete([path])

