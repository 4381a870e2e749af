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
