"""tests/unit holds fast unit tests only (issue 29: `make test-fast` runs no full Beam pipeline): inside every test
under tests/unit, `apache_beam.Pipeline.run` and a child process running `pileprep shard` fail the test. Whole
commands belong in tests/e2e/ or tests/integration/<room>/.

The guard wraps each test's setup, call and teardown (pytest calls these hooks only for items under this folder),
so a fixture of any scope that runs a pipeline while a unit test sets it up is caught too.

A TestPipeline (one composite transform run on a few elements with `assert_that`, the shape issue 29 asks for)
is allowed while it stays small, by one rule checked on its graph before it runs and on its cost after:
  - it reads no files through Beam (`iobase.Read`, which ReadFromText/Parquet/Avro/TFRecord expand to, or
    fileio's MatchAll): the elements come from the test's own `beam.Create`;
  - it holds no whole job: no `graph.BuildShards` (pipeline/shard/graph.py) and no step labelled `ListInputs`,
    the first step of both jobs' graphs (pipeline/shard/graph.py, pipeline/retrieval/build.py);
  - it uses at most TEST_PIPELINE_CPU_S of this process's CPU (the in-memory runner works in this process; a
    composite on a few elements uses ~0.4 s, a small whole shard job several seconds). CPU, not wall time: the
    machines running the tests are shared, and a wall limit would fail tests that waited for a core.
A transform count was tried and rejected: the whole default shard graph has 25 primitive steps, fewer than
near-dedup's label propagation alone (30-46 with its assert_that).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import time

import pytest

TEST_PIPELINE_CPU_S = 3.0  # the most CPU seconds one TestPipeline run may use in tests/unit (docstring)
WHOLE_JOB_STEPS = ("ListInputs",)  # labels of a whole job's first step (docstring)
OFFENDERS: list = []  # (nodeid, what) of every refused run, listed again in the terminal summary


class FullPipelineInUnitTest(AssertionError):
    """A whole Beam pipeline or `pileprep shard` run inside tests/unit (move the test to tests/integration/)."""


def command_words(args) -> list:
    if isinstance(args, (str, bytes, os.PathLike)):
        return os.fsdecode(args).split()
    return [os.fsdecode(a) for a in args]


def is_shard_command(args) -> bool:
    """True for `python -m pipeline.cli shard ...`, `pileprep shard ...` and a `python -c` child that imports
    pipeline.cli and is handed `shard` (tests/measured_cli.py's CHILD_CODE)."""
    words = command_words(args)
    launcher = next((i for i, w in enumerate(words) if "pipeline.cli" in w or os.path.basename(w) == "pileprep"),
                    None)
    if launcher is None:
        return False
    command = next((w for w in words[launcher + 1:] if not w.startswith("-")), None)
    return command == "shard"


def _refuse(nodeid: str, what: str):
    OFFENDERS.append((nodeid, what))
    raise FullPipelineInUnitTest(f"{what} inside a unit test ({nodeid}): tests/unit holds fast unit tests only; "
                                 f"move it to tests/integration/<room>/ (tests/unit/conftest.py)")


def full_pipeline_parts(pipeline) -> list:
    """What makes `pipeline` more than one small composite: (label, why) of each file read and whole job."""
    from apache_beam.io import fileio, iobase
    from apache_beam.pipeline import PipelineVisitor

    from pipeline.shard.graph import BuildShards

    found = []

    class Visitor(PipelineVisitor):
        def enter_composite_transform(self, node):
            self.visit_transform(node)

        def visit_transform(self, node):
            transform, label = node.transform, node.full_label
            if isinstance(transform, (iobase.Read, fileio.MatchAll)):
                found.append((label, f"a file read ({type(transform).__name__})"))
            elif isinstance(transform, BuildShards) or label.rsplit("/", 1)[-1] in WHOLE_JOB_STEPS:
                found.append((label, "a whole job"))

    pipeline.visit(Visitor())
    return found


@contextlib.contextmanager
def no_full_pipeline(nodeid: str):
    import apache_beam
    from apache_beam.testing.test_pipeline import TestPipeline

    real_run, real_popen_init = apache_beam.Pipeline.run, subprocess.Popen.__init__

    allowed = []  # Pipeline.run runs a copy made from the runner API proto: a TestPipeline's copy is allowed too

    def guarded_run(self, *args, **kwargs):
        if allowed:
            return real_run(self, *args, **kwargs)
        if not isinstance(self, TestPipeline):
            _refuse(nodeid, "apache_beam.Pipeline.run")
        for label, why in full_pipeline_parts(self):
            _refuse(nodeid, f"a TestPipeline with {why} at {label!r}")
        allowed.append(self)
        cpu = time.process_time()
        try:
            result = real_run(self, *args, **kwargs)
        finally:
            allowed.pop()
        used = time.process_time() - cpu
        if used > TEST_PIPELINE_CPU_S:
            _refuse(nodeid, f"a TestPipeline that used {used:.1f} s of CPU (more than {TEST_PIPELINE_CPU_S:g})")
        return result

    def guarded_popen_init(self, args, *rest, **kwargs):
        if is_shard_command(args):
            _refuse(nodeid, f"a `shard` child process ({' '.join(command_words(args))[:120]})")
        return real_popen_init(self, args, *rest, **kwargs)

    apache_beam.Pipeline.run, subprocess.Popen.__init__ = guarded_run, guarded_popen_init
    refused_before = len(OFFENDERS)
    try:
        yield
        if len(OFFENDERS) > refused_before:  # the test caught the refusal (a CLI turns errors into exit codes)
            raise FullPipelineInUnitTest(f"{nodeid}: {OFFENDERS[-1][1]} was refused (tests/unit/conftest.py)")
    finally:
        apache_beam.Pipeline.run, subprocess.Popen.__init__ = real_run, real_popen_init


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with no_full_pipeline(item.nodeid):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with no_full_pipeline(item.nodeid):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with no_full_pipeline(item.nodeid):
        return (yield)


def pytest_terminal_summary(terminalreporter):
    for nodeid, what in OFFENDERS:
        terminalreporter.write_line(f"full pipeline in tests/unit: {nodeid}: {what}", red=True)
