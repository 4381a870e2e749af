"""What `pileprep verify` found (pipeline/tools/verify.py): the file check's mismatches and notes, the content
audit's counts and problems, and the summary the CLI prints (`VerifyReport.render`; exit 1 unless `ok`).

Kept apart from the checks that fill it (verify_files.py, verify_audit.py, export_verify.py), which all take or
return these records.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class AuditResult:
    sampled: int = 0
    documents: int = 0  # sampled records that are documents, each found once, token-exact, in one split
    dead_lettered: int = 0  # sampled records found in a dead-letter file
    filtered: int = 0  # blank lines and empty texts
    problems: list[str] = field(default_factory=list)
    # sampled documents removed on purpose, by reason (near_duplicate, contaminated, mixture_weight, ...), and
    # how many written ones were checked by decoding (pipeline/tools/verify_inputs.py)
    removed: dict[str, int] = field(default_factory=dict)
    round_trip_checked: int = 0
    round_trip_note: str = ""  # how decode(tokens) was checked, when not against the text as is, or why not


@dataclass
class VerifyReport:
    dataset: str
    files_checked: int = 0
    bytes_checked: int = 0
    mismatches: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    audit: Optional[AuditResult] = None

    @property
    def ok(self) -> bool:
        return not self.mismatches and (self.audit is None or not self.audit.problems)

    def render(self) -> str:
        from pipeline.ops.safe_text import terminal as t  # noqa: PLC0415 - paths and names are the data's

        lines = [f"verify {t(self.dataset)}: {self.files_checked} files, {self.bytes_checked} bytes checked against "
                 f"the manifest: {len(self.mismatches)} mismatch(es)"]
        lines += [f"  MISMATCH {t(m)}" for m in self.mismatches]
        lines += [f"  note: {t(n)}" for n in self.notes]
        if self.audit is not None:
            a = self.audit
            lines.append(f"audit: {a.sampled} sampled records: {a.documents} documents found once and token-exact, "
                         f"{a.dead_lettered} dead-lettered, {a.filtered} filtered, removed {a.removed or 'none'}, "
                         f"{a.round_trip_checked} round-tripped; {len(a.problems)} problem(s)")
            if a.round_trip_note:
                lines.append(f"  note: {t(a.round_trip_note)}")
            lines += [f"  PROBLEM {t(p)}" for p in a.problems]
        lines.append("OK" if self.ok else "FAILED")
        return "\n".join(lines)

