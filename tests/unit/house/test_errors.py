"""pipeline/errors.py + pipeline/cli.py: an interrupted run exits 130/143 with one line."""
from __future__ import annotations




def test_interrupts_exit_130_and_143_in_one_line_even_through_beams_rewrapping(monkeypatch, capsys):
    import signal

    from pipeline import cli
    from pipeline.errors import RunInterrupted

    assert RunInterrupted(signal.SIGINT).exit_code == 130 and RunInterrupted(signal.SIGTERM).exit_code == 143
    assert RunInterrupted("interrupted by signal 15 [while running 'Tokenize']").exit_code == 143
    for raised, code in ((RunInterrupted(2), 130), (RunInterrupted(15), 143)):
        def interrupted(*_a, exc=raised):
            raise exc
        monkeypatch.setattr(cli, "cmd_shard", interrupted)
        assert cli.main(["shard", "--input", "x", "--output", "y", "--tokenizer", "z"]) == code
        assert capsys.readouterr().err == "pileprep: interrupted; previous dataset intact\n"


def test_sigterm_outside_a_job_is_one_line_and_the_handler_is_restored(monkeypatch, capsys):
    """SIGTERM while a command imports and plans (before pipeline/job.py installs its handler) or in a command
    that is not a job (export, report, verify) killed it silently; pipeline/cli.py `main` now turns it into one
    line, exit 143, and leaves the process's handler as it found it."""
    import os
    import signal

    from pipeline import cli

    def terminated(*_a):
        os.kill(os.getpid(), signal.SIGTERM)
        raise AssertionError("the signal did not interrupt")

    def default(*_a):  # stands for the default action (death by signal), as a failure this test can report
        raise AssertionError("SIGTERM reached the process's own handler")

    before = signal.signal(signal.SIGTERM, default)
    try:
        monkeypatch.setattr(cli, "cmd_export", terminated)
        assert cli.main(["export", "x"]) == 143
        assert capsys.readouterr().err == "pileprep: interrupted\n"
        assert signal.getsignal(signal.SIGTERM) is default
    finally:
        signal.signal(signal.SIGTERM, before)
