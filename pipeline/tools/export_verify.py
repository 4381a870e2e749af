"""`pileprep verify OUTPUT` for an export (pipeline/tools/export_formats.py): every file its export.json lists is
hashed and compared with the size and sha256 recorded there; a missing, truncated or changed file, a path that
leaves the output or goes through a link, is a mismatch by name. A Parquet export's export.json (pipeline/tools/
export.py) records no digests: its files are checked to exist."""
from __future__ import annotations

import json
import os

from model_contract.hashing import sha256_file
from pipeline.tools.export import EXPORT_KIND, SUMMARY_NAME
from pipeline.tools.export_formats import GENERATION_NAME, safe_relative


def is_export(path: str) -> bool:
    return os.path.isfile(os.path.join(path, SUMMARY_NAME)) and not os.path.exists(os.path.join(path, "manifest.json"))


def _inside(root: str, rel: str) -> bool:
    """No link on the way from root to the file (a link inside the output is never followed)."""
    path = root
    for part in rel.split("/"):
        path = os.path.join(path, part)
        if os.path.islink(path):
            return False
    return True


def verify_export(output: str, report) -> None:
    """Fill `report` (pipeline/tools/verify_report.py VerifyReport) from OUTPUT's export.json."""
    summary_path = os.path.join(output, SUMMARY_NAME)
    try:
        with open(summary_path, encoding="utf-8") as f:
            summary = json.load(f)
    except (OSError, ValueError) as e:
        report.mismatches.append(f"{summary_path}: unreadable export summary: {type(e).__name__}")
        return
    if not isinstance(summary, dict) or summary.get("kind") != EXPORT_KIND or not isinstance(summary.get("files"),
                                                                                              list):
        report.mismatches.append(f"{summary_path}: not an export summary (kind, files)")
        return
    generation = summary.get("generation")
    if not (isinstance(generation, str) and GENERATION_NAME.fullmatch(generation)):
        report.mismatches.append(f"{summary_path}: generation is not a name")
        return
    report.notes.append(f"{summary.get('format')} export of generation {generation}")
    for row in summary["files"]:
        rel = row.get("path") if isinstance(row, dict) else None
        if not (isinstance(rel, str) and safe_relative(rel)):
            report.mismatches.append(f"{summary_path}: a file path that leaves the output: {str(rel)[:80]!r}")
            continue
        path = os.path.join(output, rel)
        if not _inside(output, rel):
            report.mismatches.append(f"{rel}: reached through a link")
            continue
        if not os.path.isfile(path):
            report.mismatches.append(f"{rel}: missing")
            continue
        report.files_checked += 1
        if "sha256" not in row:  # a Parquet export's row
            continue
        size, sha = sha256_file(path)
        report.bytes_checked += size
        if size != row.get("bytes"):
            report.mismatches.append(f"{rel}: {size} bytes, export.json says {row.get('bytes')}")
        elif sha != row.get("sha256"):
            report.mismatches.append(f"{rel}: sha256 {sha[:12]} is not export.json's {str(row.get('sha256'))[:12]}")
