"""The HTML pieces every section of the report builds with (pipeline/tools/report.py and its section modules,
report_packing.py): a table, a section, and the one way a data string enters the page.

Kept apart from report.py so that its section modules need not import the report, which imports them (that
closed the cycle tools/report -> tools/report_packing -> tools/report).
"""
from __future__ import annotations

import html

from pipeline.ops import safe_text


def table(headers: list, rows: list, cls: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def cell(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return escape(v)


def section(title: str, *parts: str) -> str:
    anchor = "".join(c if c.isalnum() else "-" for c in title.lower())
    return f'<section id="{anchor}"><h2>{escape(title)}</h2>{"".join(parts)}</section>'


def escape(v) -> str:
    """Every data string enters the page here (or through `cell`): made inert by the one sanitizer
    (pipeline/ops/safe_text.py: control characters, escape sequences, line separators and bidi overrides written
    as visible escapes, as the terminal sinks write them), then HTML-escaped. html.escape alone left them as raw
    bytes inside the escaped text."""
    return html.escape(safe_text.terminal(v), quote=True)


def escape_lines(v) -> str:
    """`escape` for a multi-line block (a decoded example in <pre>): the same, keeping its newlines."""
    return html.escape(safe_text.log_text(v), quote=True)
