"""A fast backend that failed a spot check (pipeline/shard/markers.py mark_backend_failed): its record outlives the
failed run (keep_finished), the next run of the generation discards the units it finished (reconcile: another
backend key) whatever backend that run uses, and the units of a backend that did not fail stay reusable. The e2e
side (both tokenize graphs, the CLI): tests/e2e/test_failed_backend_not_chosen_again.py."""
from __future__ import annotations

import logging
from types import SimpleNamespace

from pipeline.shard import markers, resume
from tests.unit.shard.test_resume import UNIT, _finished_run, _notes, _plan
from transforms.io import io_utils
from transforms.shard import layout

FAST, REFERENCE = "gigatoken=1.0;domain=abc", "tokenizers=0.21"


def _plan_with(tmp_path, backend: str):
    plan = _plan(tmp_path)
    plan.tokenizer_backend = SimpleNamespace(resume_key=backend)
    return plan


def _failed_run(tmp_path, backend: str = FAST):
    """A run whose backend finished one unit, then failed a spot check; the driver kept its work."""
    plan = _plan_with(tmp_path, backend)
    _finished_run(plan)
    markers.mark_backend_failed(plan)
    return plan, resume.keep_finished(plan)


def test_the_record_outlives_the_failed_run_beside_its_finished_units(tmp_path):
    plan, kept = _failed_run(tmp_path)
    assert (kept.units, kept.cuts) == (1, 1)
    assert markers.failed_backends(plan.staging_dir) == {FAST}


def test_the_record_outlives_a_failed_run_that_finished_nothing(tmp_path):
    plan = _plan_with(tmp_path, FAST)
    _finished_run(plan)
    io_utils.delete_tree(io_utils.join(plan.staging_dir, layout.DONE_DIR))  # failed before any marker
    markers.mark_backend_failed(plan)
    assert not resume.keep_finished(plan)
    assert markers.failed_backends(plan.staging_dir) == {FAST}
    assert resume.read_resume_record(plan.staging_dir) is not None  # the next run finds the staging


def test_no_later_run_reuses_a_unit_the_failed_backend_finished(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    _failed_run(tmp_path)
    found = resume.reconcile(_plan_with(tmp_path, REFERENCE))  # auto's choice now, or --tokenizer-backend reference
    assert found.units == set() and found.cuts == {"cut-f000000"}  # a cut does not depend on the backend
    assert any(f"unit-{UNIT}" in n and f"made by tokenizer backend '{FAST}'" in n for n in _notes(caplog))


def test_units_of_a_backend_that_did_not_fail_stay_reusable(tmp_path):
    plan = _plan_with(tmp_path, REFERENCE)
    _finished_run(plan)
    io_utils.write_bytes(io_utils.join(plan.staging_dir, layout.FAILED_BACKENDS_DIR, "x.json"),
                         b'{"backend": "%s"}' % FAST.encode())  # an earlier run's fast backend failed
    kept = resume.keep_finished(plan)  # this run (the reference) failed for another reason
    assert kept.units == 1 and markers.failed_backends(plan.staging_dir) == {FAST}
    assert resume.reconcile(_plan_with(tmp_path, REFERENCE)).units == {f"unit-{UNIT}"}
