"""pipeline/tools/verify_report.py on its own: when a verify report is OK and what it prints (its escaping of the
data's names: tests/unit/ops/test_safe_text.py; filled by real checks: tests/integration/tools/test_verify.py)."""
from __future__ import annotations

from pipeline.tools.verify_report import AuditResult, VerifyReport


def test_a_report_is_ok_without_mismatches_and_audit_problems_only():
    assert VerifyReport("ds").ok
    assert VerifyReport("ds", notes=["a note is not a failure"], audit=AuditResult(sampled=3)).ok
    assert not VerifyReport("ds", mismatches=["shard x: 1 bytes"]).ok
    assert not VerifyReport("ds", audit=AuditResult(problems=["record 3 not found"])).ok


def test_render_lists_counts_mismatches_notes_and_the_audit_then_the_verdict():
    report = VerifyReport("ds", files_checked=2, bytes_checked=30, mismatches=["shard a: 3 bytes"], notes=["n"],
                          audit=AuditResult(sampled=4, documents=2, dead_lettered=1, filtered=1,
                                            problems=["p"], removed={"near_duplicate": 1}, round_trip_checked=2,
                                            round_trip_note="decoded with NFKC"))
    assert report.render().splitlines() == [
        "verify ds: 2 files, 30 bytes checked against the manifest: 1 mismatch(es)",
        "  MISMATCH shard a: 3 bytes",
        "  note: n",
        "audit: 4 sampled records: 2 documents found once and token-exact, 1 dead-lettered, 1 filtered, removed "
        "{'near_duplicate': 1}, 2 round-tripped; 1 problem(s)",
        "  note: decoded with NFKC",
        "  PROBLEM p",
        "FAILED"]
    assert VerifyReport("ds").render().splitlines()[-1] == "OK"
