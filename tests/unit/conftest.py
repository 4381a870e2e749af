"""tests/unit holds fast unit tests only (issue 29: `make test-fast` runs no full Beam pipeline): inside every test
under tests/unit, `apache_beam.Pipeline.run` and a child process running `pileprep shard` fail the test. Whole
commands belong in tests/e2e/ or tests/integration/<room>/.

The guard wraps each test's setup, call and teardown (pytest calls these hooks only for items under this folder),
so a fixture of any scope that runs a pipeline while a unit test sets it up is caught too. A TestPipeline (a
composite transform run on a few elements with `assert_that`, the shape issue 29 asks for) is allowed.
"""
from __future__ import annotations

import contextlib
import os
import subprocess

import pytest

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


@contextlib.contextmanager
def no_full_pipeline(nodeid: str):
    import apache_beam
    from apache_beam.testing.test_pipeline import TestPipeline

    real_run, real_popen_init = apache_beam.Pipeline.run, subprocess.Popen.__init__

    allowed = []  # Pipeline.run runs a copy made from the runner API proto: a TestPipeline's copy is allowed too

    def guarded_run(self, *args, **kwargs):
        if not isinstance(self, TestPipeline) and not allowed:
            _refuse(nodeid, "apache_beam.Pipeline.run")
        allowed.append(self)
        try:
            return real_run(self, *args, **kwargs)
        finally:
            allowed.pop()

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
