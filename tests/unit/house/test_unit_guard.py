"""tests/unit/conftest.py refuses a whole Beam pipeline or a `shard` child process inside a unit test."""
from __future__ import annotations

import subprocess
import sys

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.unit.conftest import OFFENDERS, FullPipelineInUnitTest, is_shard_command


def test_a_pipeline_run_is_refused_and_a_test_pipeline_is_not():
    with pytest.raises(FullPipelineInUnitTest, match="Pipeline.run"):
        with beam.Pipeline(argv=["--runner=FnApiRunner"]) as p:
            _ = p | beam.Create([1])
    assert OFFENDERS.pop()[1] == "apache_beam.Pipeline.run"  # consumed: the guard would fail this test otherwise
    with BeamTestPipeline() as p:
        assert_that(p | beam.Create([1, 2]) | beam.Map(lambda x: x * 2), equal_to([2, 4]))


def test_a_shard_child_process_is_refused_before_it_starts():
    with pytest.raises(FullPipelineInUnitTest, match="shard"):
        subprocess.run([sys.executable, "-m", "pipeline.cli", "shard", "--help"], check=False)
    OFFENDERS.pop()
    assert subprocess.run([sys.executable, "-c", "print('shard')"], capture_output=True, check=True).stdout


@pytest.mark.parametrize(("args", "refused"), [
    ([sys.executable, "-m", "pipeline.cli", "shard", "--input", "x"], True),
    (["/venv/bin/pileprep", "shard"], True),
    ("pileprep shard --output o", True),
    ([sys.executable, "-c", "from pipeline.cli import main; main(sys.argv[1:])", "shard"], True),
    ([sys.executable, "-m", "pipeline.cli", "verify", "shard"], False),  # a path named shard, not the command
    (["pileprep", "verify", "out"], False),
    (["echo", "shard"], False),
])
def test_is_shard_command(args, refused):
    assert is_shard_command(args) is refused


def _refused(build, match: str):
    """`build(p)` on a TestPipeline is refused by the guard (the refusal is consumed so this test passes)."""
    with pytest.raises(FullPipelineInUnitTest, match=match):
        with BeamTestPipeline() as p:
            build(p)
    return OFFENDERS.pop()[1]


def test_a_test_pipeline_that_reads_files_is_refused(tmp_path):
    from apache_beam.io import fileio

    (tmp_path / "in.txt").write_text("a\nb\n")
    path = str(tmp_path / "in.txt")
    what = _refused(lambda p: p | beam.io.ReadFromText(path), "file read")
    assert "ReadFromText" in what, what
    _refused(lambda p: p | fileio.MatchFiles(path) | fileio.ReadMatches(), r"file read \(MatchAll\)")


def test_a_test_pipeline_holding_a_whole_job_is_refused():
    what = _refused(lambda p: p | "ListInputs" >> beam.Create([(0, "in.jsonl", 1)]), "whole job")
    assert "'ListInputs'" in what, what
    from pipeline.shard import graph


    class SmallShards(graph.BuildShards):  # the whole job's class, any graph: refused by what it is
        def expand(self, root):
            return root | beam.Create([1])

    what = _refused(lambda p: p | "Shard" >> SmallShards(plan=None), "whole job")
    assert "'Shard'" in what, what


def test_a_test_pipeline_over_the_cpu_budget_is_refused(monkeypatch):
    import tests.unit.conftest as guard

    monkeypatch.setattr(guard, "TEST_PIPELINE_CPU_S", 0.0)
    what = _refused(lambda p: assert_that(p | beam.Create([1]), equal_to([1])), "s of CPU")
    assert "more than 0" in what, what
