"""pipeline/shard/resume.py and markers.py: a killed run's finished units are reused only when their marker, its
files, the fingerprint and the input ledger all match this run; anything else is discarded with a one-line note."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.ops import guards
from pipeline.shard import markers, resume, stage_dofn
from transforms.shard.records import InputFile, LedgerEntry, CutOutput
from transforms.io import io_utils
from transforms.shard import records

GEN, OTHER_GEN = "gen-" + "1" * 16, "gen-" + "2" * 16
UNIT = "f000000-c00000"
INPUT = b"ten bytes\n"  # the input file the killed run read; its sha256 is in its cut marker
INPUT_SHA = hashlib.sha256(INPUT).hexdigest()


def _plan(tmp_path, generation=GEN, mtime=1.5):
    output = str(tmp_path / "out")
    inp = str(tmp_path / "in.jsonl")
    if not (tmp_path / "in.jsonl").exists():  # resume checks its content (pipeline/shard/input_digests.py)
        (tmp_path / "in.jsonl").write_bytes(INPUT)
    return SimpleNamespace(
        config=SimpleNamespace(output=output, staging_dir=None), generation=generation,
        staging_dir=guards.staging_dir_for(output, None, generation), data_dir=io_utils.join(output, generation),
        ledger=[LedgerEntry(inp, 10)], input_rows=({"path": inp, "bytes": 10, "mtime": mtime},), previous=None)


def _finished_run(plan, dead_letter=True):
    """What a killed run left: its resume record, one cut and one tokenized unit, each with its marker."""
    guards.mark_staging(plan.staging_dir, plan.config.output, plan.generation)
    resume.write_resume_record(plan)
    inp = plan.ledger[0].path
    chunk = io_utils.join(plan.staging_dir, "chunks", f"{UNIT}.rec.zst")
    io_utils.write_bytes(chunk, b"chunk bytes")
    cut = CutOutput(records.CutResult(0, inp, [records.ChunkRef(0, inp, 0, chunk, 3, 11)], records.FileStats(3),
                                      None), InputFile(inp, 10, sha256=INPUT_SHA))
    markers.mark_cut(plan, cut)
    unit = records.UnitResult(
        UNIT, 0, inp, io_utils.join(plan.staging_dir, "units", UNIT + ".index"),
        io_utils.join(plan.staging_dir, "units", UNIT + ".tokens"), 2, np.dtype(np.uint16).str, ["Pile-CC", "arXiv"],
        [10, 4, 0], records.FileStats(3, 0, {"empty_text": 0}, {"invalid_json": 1}),
        io_utils.join(plan.data_dir, "dead_letter", UNIT + ".jsonl") if dead_letter else None,
        {"arXiv": {"tokens": 7, "chars": 30}}, 1, {"documents": 2})
    io_utils.write_bytes(unit.index_path, b"index")
    io_utils.write_bytes(unit.tokens_path, b"tokens" * 10)
    if dead_letter:
        io_utils.write_jsonl(unit.dead_letter_path, [{"file": inp, "line": 2, "reason": "invalid_json"}])
    markers.mark_unit(plan, unit)
    return cut, unit


def _notes(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "pileprep.resume" and r.levelno >= logging.WARNING]


def test_finished_work_of_the_same_run_is_reused_as_it_was(tmp_path, caplog):
    plan = _plan(tmp_path)
    cut, unit = _finished_run(plan)
    found = resume.reconcile(plan)
    assert found.units == {"unit-" + UNIT} and found.cuts == {"cut-f000000"} and _notes(caplog) == []
    assert markers.load_unit(plan, UNIT) == unit  # the very result the killed run's pack stage would have seen
    assert markers.load_cut(plan, 0) == cut
    assert markers.load_cut(plan, 0, spilled=False) is None  # its chunks are files: not what a fused run reuses


def test_a_cut_made_without_chunk_files_is_reused_only_by_a_run_that_needs_none(tmp_path, caplog):
    """A file cut and tokenized in one worker (pipeline/shard/stage_dofn.py CutAndTokenizeFile) marks its cut with no
    chunk file; a run that spreads chunks through staging must cut that file again (and the other way round)."""
    plan = _plan(tmp_path)
    _finished_run(plan)
    inp = plan.ledger[0].path
    cut = CutOutput(records.CutResult(0, inp, [records.ChunkRef(0, inp, 0, "", 3, 11)], records.FileStats(3), None,
                                      spilled=False), InputFile(inp, 10, sha256=INPUT_SHA))
    markers.mark_cut(plan, cut)
    marker = json.loads(io_utils.read_bytes(markers.marker_path(plan.staging_dir, "cut-f000000")))
    assert marker["files"] == [] and marker["result"]["spilled"] is False
    assert resume.reconcile(plan).cuts == {"cut-f000000"}
    assert markers.load_cut(plan, 0, spilled=False) == cut
    assert markers.load_cut(plan, 0) is None  # a spilled cut is wanted: cut again, no chunk file trusted
    assert _notes(caplog) == []

    marker["result"]["spilled"] = "no"
    io_utils.write_bytes(markers.marker_path(plan.staging_dir, "cut-f000000"), json.dumps(marker).encode())
    assert resume.reconcile(plan).cuts == set()
    assert any("spilled is not a bool" in n for n in _notes(caplog))


def test_a_damaged_file_or_marker_is_discarded_with_a_note_and_redone(tmp_path, caplog):
    plan = _plan(tmp_path)
    _cut, unit = _finished_run(plan)
    with open(unit.index_path, "ab") as f:
        f.write(b"+")  # another size: the driver's check finds it
    io_utils.write_bytes(markers.marker_path(plan.staging_dir, "cut-f000000"), b'{"fingerprint": "gen-')
    found = resume.reconcile(plan)
    assert found.units == set() and found.cuts == set()
    notes = _notes(caplog)
    assert len(notes) == 2 and all("\n" not in n for n in notes)
    assert any(f"unit-{UNIT}" in n and f"units/{UNIT}.index is damaged (6 bytes" in n for n in notes)
    assert any("cut-f000000" in n and "unreadable" in n for n in notes)
    assert not io_utils.exists(markers.marker_path(plan.staging_dir, "unit-" + UNIT))  # gone: never reused later


def test_same_size_other_bytes_are_found_by_the_worker_that_would_reuse_the_unit(tmp_path, caplog):
    plan = _plan(tmp_path)
    _cut, unit = _finished_run(plan)
    data = bytearray(open(unit.tokens_path, "rb").read())
    data[3] ^= 1  # same size, other bytes: only the sha256 tells
    open(unit.tokens_path, "wb").write(bytes(data))
    assert resume.reconcile(plan).units == {"unit-" + UNIT}  # sizes only on the driver
    assert markers.load_unit(plan, UNIT) is None  # the worker tokenizes it again
    (note,) = _notes(caplog)
    assert f"unit-{UNIT}" in note and f"units/{UNIT}.tokens is damaged" in note and "redone" in note
    assert not io_utils.exists(markers.marker_path(plan.staging_dir, "unit-" + UNIT))


def test_a_missing_dead_letter_file_in_the_generation_directory_discards_the_unit(tmp_path, caplog):
    plan = _plan(tmp_path)
    _cut, unit = _finished_run(plan)
    (tmp_path / "out" / GEN / "dead_letter" / (UNIT + ".jsonl")).unlink()
    assert resume.reconcile(plan).units == set()
    assert any("missing" in n for n in _notes(caplog))


def _point_elsewhere(marker: dict) -> None:
    marker["files"][0]["path"] = "../../../elsewhere/secret"


def _other_fingerprint(marker: dict) -> None:
    marker["fingerprint"] = OTHER_GEN  # copied in from another run's staging


@pytest.mark.parametrize("damage, note_has", [(_point_elsewhere, ("not the ones its unit writes",)),
                                              (_other_fingerprint, ("fingerprint", OTHER_GEN))],
                         ids=["files-its-unit-does-not-write", "another-fingerprint"])
def test_a_damaged_marker_is_discarded_with_a_note(tmp_path, caplog, damage, note_has):
    plan = _plan(tmp_path)
    _finished_run(plan)
    path = markers.marker_path(plan.staging_dir, "unit-" + UNIT)
    marker = json.loads(io_utils.read_bytes(path))
    damage(marker)
    io_utils.write_bytes(path, json.dumps(marker).encode())
    assert resume.reconcile(plan).units == set()
    assert any(all(part in n for part in note_has) for n in _notes(caplog))


def test_the_staging_of_another_fingerprint_is_removed_with_its_partial_generation(tmp_path, caplog):
    old = _plan(tmp_path, OTHER_GEN)
    _finished_run(old)
    plan = _plan(tmp_path)
    found = resume.reconcile(plan)
    assert found.units == set()
    assert not (tmp_path / "out" / OTHER_GEN).exists() and not io_utils.exists(old.staging_dir)
    (note,) = _notes(caplog)
    assert "another fingerprint" in note and old.staging_dir in note


def test_a_changed_input_ledger_or_no_resume_discards_the_whole_staging(tmp_path, caplog):
    _finished_run(_plan(tmp_path))
    touched = _plan(tmp_path, mtime=2.5)  # same path and size (same generation name), the file was rewritten
    assert resume.reconcile(touched).units == set()
    assert "input ledger changed" in _notes(caplog)[-1] and not (tmp_path / "out" / GEN).exists()
    _finished_run(_plan(tmp_path))
    assert resume.reconcile(_plan(tmp_path), enabled=False).units == set()
    assert "--no-resume" in _notes(caplog)[-1]


def test_cleanup_keeps_a_resumable_staging_and_its_generation_but_not_a_plain_one(tmp_path):
    plan = _plan(tmp_path)
    _finished_run(plan)
    plain = _plan(tmp_path, OTHER_GEN)
    guards.mark_staging(plain.staging_dir, plain.config.output, OTHER_GEN)
    (tmp_path / "out" / OTHER_GEN).mkdir(parents=True)
    root = guards.staging_root(plan.config.output, None)
    removed = guards.cleanup_abandoned(plan.config.output, root, None)
    assert sorted(removed) == sorted([plain.staging_dir, str(tmp_path / "out" / OTHER_GEN)])
    assert io_utils.exists(plan.staging_dir) and (tmp_path / "out" / GEN).exists()
    # Once its generation is committed (the killed run got that far), it is a plain leftover.
    assert guards.cleanup_abandoned(plan.config.output, root, None, keep={GEN}) == [plan.staging_dir]


def test_a_killed_writers_temp_files_are_removed_when_resuming(tmp_path):
    plan = _plan(tmp_path)
    _finished_run(plan)
    leftover = tmp_path / "out" / GEN / ".train-00000-of-00002.tfrecord.0123456789ab.part"
    leftover.write_bytes(b"half")
    resume.reconcile(plan)
    assert not leftover.exists()


def test_records_round_trip_without_dead_letters(tmp_path):
    plan = _plan(tmp_path)
    _cut, unit = _finished_run(plan, dead_letter=False)
    assert resume.reconcile(plan).units == {"unit-" + UNIT}
    assert markers.load_unit(plan, UNIT) == dataclasses.replace(unit, dead_letter_path=None)


def test_a_relative_output_resumes_its_own_staging(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    plan = _plan(tmp_path)
    output = "./out/"  # the spelling a user may give; FileSystems lists it back as it was given
    plan.config.output = output
    plan.staging_dir = guards.staging_dir_for(output, None, GEN)
    plan.data_dir = io_utils.join(output, GEN)
    _finished_run(plan)
    assert resume.reconcile(plan).units == {"unit-" + UNIT} and _notes(caplog) == []


# ------------------------------------------------------------------------------------------ packed shards
TASK = records.ShardTask(0, 3, 8)
PACK = "pack-train-00003-of-00008"


def _packed_shard(plan) -> "records.ShardResult":
    """A packed shard as pack_shard leaves it (its shard in the partial generation, its kept ids in staging),
    with its marker."""
    result = records.ShardResult(
        TASK, io_utils.join(plan.data_dir, TASK.file_name), 5, 1200, 80, 7, 0, "",
        sources={"arXiv": {"documents": 7, "tokens": 1207}}, written_per_file={"in.jsonl": 7},
        duplicates_per_file={"in.jsonl": 1}, duplicates_per_source={"arXiv": 1},
        ids_path=io_utils.join(plan.staging_dir, "ids", TASK.file_name + ".ids"), ids_count=7,
        source_stats={"arXiv": {"tokens": 1200, "lengths": [3, 4.5]}},
        filtered_per_file={"in.jsonl": {"near_duplicate": 2}}, filtered_per_source={"near_duplicate": {"arXiv": 2}})
    io_utils.write_bytes(result.path, b"shard bytes")
    io_utils.write_bytes(result.ids_path, b"ids")
    # as pack_shard's HashingWriter computed them while writing: the marker takes them from the result
    result.bytes, result.sha256 = 11, hashlib.sha256(b"shard bytes").hexdigest()
    markers.mark_pack(plan, result)
    return result


def test_a_packed_shard_is_reused_as_it_was_and_its_paths_come_from_its_task(tmp_path, caplog):
    plan = _plan(tmp_path)
    _finished_run(plan)
    shard = _packed_shard(plan)
    path = markers.marker_path(plan.staging_dir, PACK)
    marker = json.loads(io_utils.read_bytes(path))
    marker["result"]["path"] = "/etc/passwd"  # a field the record never reads
    io_utils.write_bytes(path, json.dumps(marker).encode())
    found = resume.reconcile(plan)
    assert found.packs == {PACK} and _notes(caplog) == []
    plan = SimpleNamespace(**vars(plan), resumed_packs=found.packs)
    assert markers.load_pack(plan, TASK) == shard  # every field, the paths made from the task
    packer = stage_dofn.PackShard(plan)  # reuse or compute (pipeline/shard/stage_dofn.py): reused, not packed
    packer.compute = lambda _element: pytest.fail("packed again")
    assert packer.run_one((TASK, "", None)) == shard


@pytest.mark.parametrize("field, value, note_has", [
    ("num_shards", 2, "out of range"), ("sha256", "../x", "hex digest"), ("split", 1, "another name"),
    ("sources", {"arXiv": 3}, "sources")])
def test_a_hostile_pack_marker_is_discarded_and_the_shard_packed_again(tmp_path, caplog, field, value, note_has):
    plan = _plan(tmp_path)
    _finished_run(plan)
    _packed_shard(plan)
    path = markers.marker_path(plan.staging_dir, PACK)
    marker = json.loads(io_utils.read_bytes(path))
    marker["result"][field] = value
    io_utils.write_bytes(path, json.dumps(marker).encode())
    assert resume.reconcile(plan).packs == set()
    assert any(PACK in n and note_has in n for n in _notes(caplog))
    assert not io_utils.exists(path)  # gone: no later run reuses it either


def test_a_failed_run_keeps_only_marked_work_in_staging_and_in_its_partial_generation(tmp_path):
    plan = _plan(tmp_path)
    _finished_run(plan)
    shard = _packed_shard(plan)
    unmarked = io_utils.join(plan.data_dir, "train-00004-of-00008.tfrecord")  # written, its marker never was
    io_utils.write_bytes(unmarked, b"half a run")
    io_utils.write_bytes(io_utils.join(plan.staging_dir, "units", "f000000-c00001.tokens"), b"in progress")
    kept = resume.keep_finished(plan)
    assert (kept.units, kept.cuts, kept.shards) == (1, 1, 1)
    assert kept.describe() == "1 finished unit and 1 packed shard"
    assert io_utils.exists(shard.path) and io_utils.exists(shard.ids_path)
    assert io_utils.exists(io_utils.join(plan.data_dir, "dead_letter", UNIT + ".jsonl"))  # a kept unit's
    assert not io_utils.exists(unmarked)
    assert not io_utils.exists(io_utils.join(plan.staging_dir, "units", "f000000-c00001.tokens"))


# ------------------------------------------------------------------------------------------ the near-dedup stage
def _near_dedup_done(plan) -> None:
    staged = [io_utils.join(plan.staging_dir, "near-dedup", n) for n in ("removals.json", "removed-x-p000.idx")]
    published = [io_utils.join(plan.data_dir, "near-dedup", n) for n in ("summary.json", "removed-p000.jsonl")]
    for path in staged + published:
        io_utils.write_bytes(path, path.encode())
    markers.mark_near_dedup(plan, staged, published)


@pytest.mark.parametrize("damage, note_has", [
    (lambda m: m["files"].append({"root": "data", "path": "../../etc/passwd", "bytes": 1, "sha256": ""}),
     "is not a file the near-dedup stage writes"),
    (lambda m: m["files"].pop(0), "lack the removals list or the summary"),
    (None, "damaged")], ids=["a-path-elsewhere", "no-removals-list", "same-size-other-bytes"])
def test_the_near_dedup_stage_is_reused_only_when_its_marker_and_every_file_check(tmp_path, caplog, damage, note_has):
    plan = _plan(tmp_path)
    _finished_run(plan)
    _near_dedup_done(plan)
    assert resume.reconcile(plan).near_dedup and _notes(caplog) == []
    path = markers.marker_path(plan.staging_dir, markers.NEAR_DEDUP)
    if damage is None:  # same size, other bytes: the driver checks the sha256 (no worker re-reads them)
        io_utils.write_bytes(io_utils.join(plan.data_dir, "near-dedup", "summary.json"),
                             io_utils.join(plan.data_dir, "near-dedup", "summary.jsoN").encode())
    else:
        marker = json.loads(io_utils.read_bytes(path))
        marker["files"].sort(key=lambda r: (r["root"] != "staging", r["path"] != "near-dedup/removals.json"))
        damage(marker)
        io_utils.write_bytes(path, json.dumps(marker).encode())
    assert not resume.reconcile(plan).near_dedup
    assert any(markers.NEAR_DEDUP in n and note_has in n for n in _notes(caplog))
