"""pipeline/shard/stage_dofn.py: "reuse or compute, mark, count" written once, and the stage DoFn that runs it
inside cancel.call (no Beam pipeline: the DoFn's process is called directly)."""
from __future__ import annotations

import pytest

from pipeline.shard import cancel, stage_dofn


def _recorder(reused_value):
    calls = []

    def reuse():
        calls.append("reuse")
        return reused_value

    def compute():
        calls.append("compute")
        return "computed"

    def mark(result):
        calls.append(("mark", result))

    def count(result, reused):
        calls.append(("count", result, reused))

    return calls, reuse, compute, mark, count


def test_an_earlier_runs_result_is_reused_counted_and_neither_computed_nor_marked_again():
    calls, reuse, compute, mark, count = _recorder("earlier")
    assert stage_dofn.reuse_or_compute(reuse, compute, mark, count) == "earlier"
    assert calls == ["reuse", ("count", "earlier", True)]


def test_without_one_the_result_is_computed_marked_then_counted():
    calls, reuse, compute, mark, count = _recorder(None)
    assert stage_dofn.reuse_or_compute(reuse, compute, mark, count) == "computed"
    assert calls == ["reuse", "compute", ("mark", "computed"), ("count", "computed", False)]


class _Doubling(stage_dofn.StageDoFn):
    def __init__(self):
        super().__init__(plan=None)
        self.marked, self.counted = [], []

    def reuse(self, element):
        return None

    def compute(self, element):
        cancel.check()
        return 2 * element

    def mark(self, result):
        self.marked.append(result)

    def count(self, element, result, reused):
        self.counted.append((element, result, reused))


def test_the_stage_dofn_yields_marks_and_counts_each_result():
    cancel.reset()  # a run cancelled earlier in this process (another test) leaves the flag set until the next run
    fn = _Doubling()
    assert list(fn.process(4)) == [8]
    assert fn.marked == [8] and fn.counted == [(4, 8, False)]


def test_once_the_driver_cancels_the_element_is_dropped_and_nothing_is_marked():
    fn = _Doubling()
    try:
        assert cancel.cancel_and_wait(1.0)
        assert list(fn.process(4)) == []
    finally:
        cancel.reset()
    assert fn.marked == [] and fn.counted == []


def test_a_stage_that_does_not_say_how_to_reuse_fails_loudly():
    with pytest.raises(NotImplementedError):
        stage_dofn.StageDoFn(plan=None).run_one(1)
