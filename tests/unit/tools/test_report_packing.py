"""pipeline/tools/report_packing.py on its own: the report's packing section from a hand-written manifest `packing`
section (none for the default concat packing)."""
from __future__ import annotations

from pipeline.tools.report_packing import packing_section


def test_no_section_without_a_packing_summary():
    assert packing_section({}) == "" and packing_section({"packing": {"splits": "not a dict"}}) == ""


def test_one_row_per_split_then_its_sources_with_padding_per_split_only_and_names_escaped():
    manifest = {"packing": {"packing": "best-fit", "window_examples": 64, "splits": {
        "train": {"documents": 9, "split_share": 0.25, "fitting_split": 1, "examples_per_document": 1.5,
                  "padding_fraction": 0.0125,
                  "sources": {"b<i>": {"documents": 4, "split_share": 0.5}, "a": {"documents": 5}}},
        "val": "not a dict"}}}
    html = packing_section(manifest)
    assert "Packing best-fit, window 64 examples" in html
    assert html.index("(all)") < html.index(">a<") < html.index("b&lt;i&gt;")  # split first, sources sorted
    assert "25.000%" in html and "1.2500%" in html and "50.000%" in html and "<i>" not in html
    assert "val" not in html
