"""pipeline/shard/input_digests.py: resume reuses an input's finished work only when the input's bytes (full
sha256) are those the earlier run recorded; a file rewritten with the same size (and the same mtime: the same
resume ledger row) has its work redone, and units whose file has no recorded sha256 are redone."""
from __future__ import annotations

import logging

from pipeline.shard import input_digests, markers, resume
from tests.unit.shard.test_resume import INPUT, PACK, UNIT, _finished_run, _packed_shard, _plan


def _notes(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "pileprep.resume" and r.levelno >= logging.WARNING]


def test_an_input_rewritten_with_the_same_size_has_its_finished_work_redone(tmp_path, caplog):
    plan = _plan(tmp_path)
    _finished_run(plan)
    _packed_shard(plan)
    assert resume.reconcile(plan).packs == {PACK}  # unchanged input: everything reused
    (tmp_path / "in.jsonl").write_bytes(INPUT.upper())  # same size (same ledger row), other bytes
    found = resume.reconcile(plan)
    assert found.units == set() and found.cuts == set() and found.packs == set()  # packs were built from it
    assert any("in.jsonl changed since an earlier run read it" in n for n in _notes(caplog))
    assert not list((tmp_path / "out" / "_staging").glob("*/done/*.json"))  # markers gone: never reused later


def test_a_unit_whose_input_has_no_recorded_sha256_is_redone_and_one_with_it_is_reused(tmp_path, caplog):
    plan = _plan(tmp_path)
    _finished_run(plan)
    markers.delete_file(markers.marker_path(plan.staging_dir, "cut-f000000"))  # the file was not finished
    assert resume.reconcile(plan).units == set()  # a staging of an older pileprep: no recorded sha256
    assert any("no recorded sha256" in n for n in _notes(caplog))

    _finished_run(plan)
    markers.delete_file(markers.marker_path(plan.staging_dir, "cut-f000000"))
    input_digests.mark_input(plan, 0, plan.ledger[0].path)  # recorded before the file was cut, as workers do
    assert resume.reconcile(plan).units == {"unit-" + UNIT}
