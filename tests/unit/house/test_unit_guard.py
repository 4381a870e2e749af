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
