"""Data is never code at a text sink: strings from the data made inert before they reach a terminal, a log or
a plot.

Source names, file names, document excerpts and manifest fields are the data's, not ours: a source named
`"\\x1b[2J"` clears the terminal that prints `pileprep inspect`, a `"\\r"` or `"\\n"` forges a progress or log
line, and `"$x^2$"` is rendered as mathtext in a matplotlib title. Every such sink passes them through one of:

* `terminal(s)` for one line on a terminal (inspect, verify, progress lines, summary tables, retrieval show):
  every control character (C0, DEL, C1 - so every terminal escape sequence, which starts with ESC or CSI) and
  line/paragraph separator or bidirectional override is written as its visible escape (`\\x1b`, `\\n`,
  `\\u202e`): the text stays readable and searchable but cannot move the cursor, recolour or add a line;
* `log_text(s)` for a formatted log record: the same, except the newlines of a traceback;
* `plot(s)` for matplotlib text: `terminal(s)` with `$` escaped so mathtext never starts.
"""
from __future__ import annotations

import re

# C0 controls, DEL, C1 controls; Unicode line/paragraph separators; bidirectional embeddings/overrides/isolates
# (text that displays in another order than it reads).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_KEEP_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match) -> str:
    c = m.group(0)
    if c in _NAMED:
        return _NAMED[c]
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def terminal(value) -> str:
    """`value` as one inert line of text (see the module doc)."""
    return _UNSAFE.sub(_escape, value if isinstance(value, str) else str(value))


def log_text(value) -> str:
    """A formatted log record: inert like `terminal`, keeping the newlines between a traceback's lines."""
    return _UNSAFE_KEEP_NEWLINE.sub(_escape, value if isinstance(value, str) else str(value))


def plot(value) -> str:
    """Text for a matplotlib label, title or legend: inert, and `$` escaped so no mathtext is parsed."""
    return terminal(value).replace("$", r"\$")

