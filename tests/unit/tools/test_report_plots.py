"""pipeline/tools/report_plots.py: per-source token bars are shares of each split's tokens on one linear scale from
zero, so a source's bar in train and in val, and two sources' bars, compare by length (issue: the report as a
data engineer reads it)."""
from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from pipeline.tools import report_plots  # noqa: E402

MANIFEST = {"splits": {"train": {}, "val": {}},
            "sources": {"Pile-CC": {"train": {"tokens": 600}, "val": {"tokens": 10}},
                        "ArXiv": {"train": {"tokens": 300}, "val": {"tokens": 30}},
                        "Github": {"train": {"tokens": 100}}}}


def test_token_bars_are_shares_of_their_split_on_one_linear_scale_from_zero(monkeypatch):
    drawn = []
    monkeypatch.setattr(report_plots, "_img", lambda plot_id, fig, alt, adjust=True: drawn.append(fig) or "")
    report_plots.plot_tokens_per_source(MANIFEST)
    (fig,) = drawn
    (ax,) = fig.axes
    assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0  # lengths compare: no log axis, no offset
    widths = {}
    labels = [t.get_text() for t in ax.get_yticklabels()]
    for container, split in zip(ax.containers, ("train", "val")):
        for bar, source in zip(container, labels):
            widths[split, source] = bar.get_width()
    # each split's bars are % of that split's tokens (a small val split reads on the same 0-100 scale)
    assert widths == pytest.approx({("train", "ArXiv"): 30.0, ("train", "Github"): 10.0, ("train", "Pile-CC"): 60.0,
                                    ("val", "ArXiv"): 75.0, ("val", "Github"): 0.0, ("val", "Pile-CC"): 25.0})
    assert ax.get_xlim()[1] >= 75.0  # every bar inside the one axis
    assert "%" in ax.get_xlabel() and [t.get_text() for t in ax.get_legend().get_texts()] == ["train", "val"]
