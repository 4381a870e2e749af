"""Data is never code at a text sink: hostile strings (`\\x1b[2J`, `\\r`, `\\n`, `$x^2$`) from the data reach
each terminal, log and plot sink inert."""
from __future__ import annotations

import io
import logging

import pytest

from pipeline.ops import progress, safe_text

HOSTILE = ["\x1b[2J", "a\rb", "a\nforged line", "$x^2$", "\x9b31m", "\u202eevil", "\x07bell"]


def _inert(text: str) -> bool:
    return not any(c in text for c in "\x1b\r\x07\x9b\u202e")


@pytest.mark.parametrize("value", HOSTILE)
def test_terminal_escapes_every_control_and_keeps_the_text_readable(value):
    out = safe_text.terminal(value)
    assert _inert(out) and "\n" not in out
    assert safe_text.terminal("plain text, ü, 中文") == "plain text, ü, 中文"  # printable text is untouched


def test_plot_text_never_starts_mathtext():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipeline.tools import report_plots

    fig, ax = plt.subplots()
    report_plots._bars(ax, ["$x^2$", "\x1b[2J"], {"$a$": [1, 2], "b": [3, 4]}, "y")
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == [r"\$x^2\$", "\\x1b[2J"]
    assert [t.get_text() for t in ax.get_legend().get_texts()][0] == r"\$a\$"
    fig.canvas.draw()  # renders: with the `$` escaped, mathtext does not parse (or fail on) the label
    plt.close(fig)


def _manifest(source: str) -> dict:
    split = {"shards": 1, "examples": 1, "documents": 1, "tokens": 1, "padding_tokens": 0}
    return {"pileprep_version": "1\x1b[2J", "generation": "gen-\rX", "padding_fraction": 0.0, "dead_letters": [],
            "contract": {"version": "1.1", "seq_len": 8, "tokenizer": {"vocab_size": 10, "model_sha256": "\x1b]0;t"}},
            "records": {"read": 1, "written": 1, "filtered": {"x\ny": 0}, "dead_lettered": {}},
            "splits": {"train": split}, "sources": {source: {"train": {"documents": 1, "tokens": 1}}}}


@pytest.mark.parametrize("source", HOSTILE)
def test_inspect_summary_table_is_inert(source):
    from pipeline.tools.inspect_dataset import summary_table

    table = summary_table(_manifest(source))
    assert _inert(table)
    assert len(table.splitlines()) == len(summary_table(_manifest("plain")).splitlines())  # no forged line


def test_progress_summary_table_and_display_are_inert():
    table = progress.summary_table({"src\x1b[2J\nx": 3}, 1.0, extra_rows=[("from \rdata", "\x1b[31m", "1")])
    assert _inert(table) and len(table.splitlines()) == 5
    stream = io.StringIO()
    display = progress.Display(stream, tty=False)
    p = progress.Progress(1.0, {"documents": 1})
    display.emit(logging.makeLogRecord({"progress": p}))
    assert _inert(stream.getvalue()) and stream.getvalue().count("\n") == 1


def test_verify_report_and_retrieval_show_are_inert():
    from pipeline.retrieval.show import _clip
    from pipeline.tools.verify_report import VerifyReport

    report = VerifyReport("ds\x1b[2J", mismatches=["shard gen-x/\r\x1b[2Jfake: 1 bytes"], notes=["a\nOK"])
    text = report.render()
    assert _inert(text) and len(text.splitlines()) == 4 and text.splitlines()[-1] == "FAILED"
    assert _inert(_clip("doc \x1b[2J text\r$x$"))


def test_cli_error_line_is_inert(capsys, tmp_path):
    from pipeline import cli

    bad = tmp_path / "in\x1b[2Jput"
    assert cli.main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert _inert(err) and len(err.strip().splitlines()) == 1 and "\\x1b[2J" in err
