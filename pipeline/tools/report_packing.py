"""The report's packing section (pipeline/tools/report.py): per split and source, what the packing did to the
documents, from the manifest's `packing` section (pipeline/shard/manifest_builder.py; present only when the
packing is not the default concat)."""
from __future__ import annotations

from pipeline.tools.report_html import escape, section, table


def packing_section(manifest: dict) -> str:
    packing = manifest.get("packing")
    if not isinstance(packing, dict) or not isinstance(packing.get("splits"), dict):
        return ""
    rows = []
    for split, s in packing["splits"].items():
        if not isinstance(s, dict):
            continue
        rows.append([split, "(all)", s.get("documents", 0), f"{100 * float(s.get('split_share', 0)):.3f}%",
                     s.get("fitting_split", 0), float(s.get("examples_per_document", 0)),
                     f"{100 * float(s.get('padding_fraction', 0)):.4f}%"])
        for source, c in sorted((s.get("sources") or {}).items()):
            rows.append([split, source, c.get("documents", 0), f"{100 * float(c.get('split_share', 0)):.3f}%",
                         c.get("fitting_split", 0), float(c.get("examples_per_document", 0)), "—"])
    return section(
        "Packing", table(["split", "source", "documents", "split over examples", "split although they fit",
                           "examples per document", "padding"], rows),
        f"<p>Packing {escape(str(packing.get('packing')))}, window {escape(str(packing.get('window_examples')))} examples "
        "(transforms/shard/best_fit.py). Padding is per split: an example's padding belongs to no source.</p>")
