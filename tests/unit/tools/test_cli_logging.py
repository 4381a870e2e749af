"""pipeline/cli_logging.py on its own: how a command's failure comes back from its worker log, and the log level
-v / -q ask for (the worker log's redirection of fd 2 in a real run: tests/e2e/test_observability.py)."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from pipeline import cli_logging
from pipeline.errors import RunError, UsageError

ARGS = SimpleNamespace(quiet=True, verbose=0)


def _raise(exc):
    def fn(_worker_log):
        raise exc
    return fn


def test_a_run_returns_its_value_and_a_user_or_known_error_passes_through_as_it_is(tmp_path, capsys):
    assert cli_logging.in_worker_log(str(tmp_path), ARGS, lambda log: 7) == 7
    with pytest.raises(UsageError, match="bad flag"):
        cli_logging.in_worker_log(str(tmp_path), ARGS, _raise(UsageError("bad flag")))
    with pytest.raises(RunError, match="no space left"):
        cli_logging.in_worker_log(str(tmp_path), ARGS, _raise(RunError("no space left")))


def test_any_other_failure_becomes_run_failed_carrying_its_cause(tmp_path, capsys):
    cause = ValueError("worker died")
    with pytest.raises(cli_logging.RunFailed, match="worker died") as caught:
        cli_logging.in_worker_log(str(tmp_path), ARGS, _raise(cause))
    assert caught.value.__cause__ is cause and caught.value.tail == []  # no fd 2 under capsys: nothing logged


@pytest.mark.parametrize("verbose,quiet,level", [(0, False, logging.WARNING), (1, False, logging.INFO),
                                                 (2, False, logging.DEBUG), (0, True, logging.ERROR)])
def test_the_root_level_follows_verbose_and_quiet(verbose, quiet, level):
    root = logging.getLogger()
    saved = root.level
    try:
        cli_logging.configure_logging(SimpleNamespace(verbose=verbose, quiet=quiet))
        assert root.level == level
    finally:
        root.setLevel(saved)


def test_beams_apitools_import_and_job_server_stop_warnings_are_filtered_and_nothing_else():
    def record(msg, name="apache_beam"):
        return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, None, None)
    stop = "Really destroying service at localhost:1 with cmd: ('java', '-jar', 'x.jar')"
    assert not cli_logging._quiet_beam_noise(record("apitools not found; falling back"))
    assert not cli_logging._quiet_beam_noise(record(stop, "apache_beam.utils.subprocess_server"))
    assert cli_logging._quiet_beam_noise(record(stop))  # the same words from another logger are kept
    assert cli_logging._quiet_beam_noise(record("something else", "apache_beam.utils.subprocess_server"))
