"""The tokenizer backend in the unit resume key (pipeline/shard/markers.py backend_key, transforms/tokenize/
tokenizer_backends.py BackendChoice.resume_key): a finished unit is reused only by a run whose backend has the
same name, versions and domain digest, and a backend recorded as failed in the staging is never chosen again.
Guards the issue-28 mutation check (docs/wip/mutation-issue28.md) found untested at unit level."""
from __future__ import annotations

import dataclasses
import logging

import pytest

from pipeline.shard import markers, resume
from tests.conftest import shared_data
from tests.unit.shard.test_resume import UNIT, _finished_run, _plan
from tests.unit.tokenize.test_tokenizer_backends import LLAMA2, _sp
from transforms.tokenize import tokenizer_backends as tb
from transforms.tokenize.tokenizer_backends import BackendChoice

GIGA = BackendChoice("gigatoken", "auto", "parity", "0.5.0", domain_sha256="d" * 64, reference_version="0.22.1",
                     reference_format="hf_json")


def _reused_with(tmp_path, made_by: BackendChoice, rerun_by: BackendChoice) -> tuple:
    plan = _plan(tmp_path)
    plan.tokenizer_backend = made_by
    _finished_run(plan)
    again = _plan(tmp_path)
    again.tokenizer_backend = rerun_by
    return resume.reconcile(again).units, again


def _notes(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "pileprep.resume" and r.levelno >= logging.WARNING]


def test_a_unit_is_reused_by_the_same_backend(tmp_path, caplog):
    units, _ = _reused_with(tmp_path, GIGA, dataclasses.replace(GIGA, reason="another sample"))
    assert units == {"unit-" + UNIT} and _notes(caplog) == []


def test_a_unit_of_another_domain_is_not_reused(tmp_path, caplog):
    units, _ = _reused_with(tmp_path, GIGA, dataclasses.replace(GIGA, domain_sha256="e" * 64))
    assert units == set()
    assert any("made by tokenizer backend 'gigatoken=" in n for n in _notes(caplog))


def test_a_unit_of_another_backend_version_is_not_reused(tmp_path):
    assert _reused_with(tmp_path, GIGA, dataclasses.replace(GIGA, version="0.5.1"))[0] == set()


def test_a_unit_of_another_reference_version_is_not_reused(tmp_path):
    assert _reused_with(tmp_path, GIGA, dataclasses.replace(GIGA, reference_version="0.22.2"))[0] == set()


def test_a_backend_marked_failed_is_listed_in_its_staging(tmp_path):
    plan = _plan(tmp_path)
    plan.tokenizer_backend = GIGA
    _finished_run(plan)
    assert markers.failed_backends(plan.staging_dir) == frozenset()
    markers.mark_backend_failed(plan)
    assert markers.failed_backends(plan.staging_dir) == {GIGA.resume_key}


def test_auto_never_chooses_a_backend_that_failed_in_this_generation():
    pytest.importorskip("gigatoken")
    model = shared_data(*LLAMA2)
    sp = _sp(model)
    texts = ["A plain sample document, it's fine.\n" * 20]
    first = tb.choose_backend("auto", model.read_bytes(), sp, texts)
    assert first.name == "gigatoken", first.reason
    again = tb.choose_backend("auto", model.read_bytes(), sp, texts, failed=frozenset({first.resume_key}))
    assert again.name != "gigatoken" and "gigatoken: failed a spot check in an earlier run" in again.reason
