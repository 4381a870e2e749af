"""No measured timing in a product module's comments (issue 29: "benchmark figures move from comments into
docs/BENCHMARKS.md"; review29 found four left, above constants): a figure in a comment is not re-measured when
the code changes, so the comment says why and cites where the figure is kept (docs/BENCHMARKS.md,
docs/OPERATIONS.md), which the bench re-measures."""
from __future__ import annotations

import io
import pathlib
import re
import tokenize

from tests.conftest import REPO

PACKAGES = ("model_contract", "transforms", "pipeline", "trainer")
# a duration: `~5 s`, `0.4 CPU-s`, `30 ms`, `12 seconds` (a number followed by a unit of time)
TIMING = re.compile(r"\b\d+(?:\.\d+)?\s?(?:CPU-s|core-s|ms|µs|s|sec|seconds|minutes|min)\b")


def timed_comments(source: str) -> list:
    """(line, comment) for every `#` comment of `source` that states a duration."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and TIMING.search(tok.string):
            out.append((tok.start[0], tok.string.strip()))
    return out


def test_no_product_comment_states_a_measured_duration():
    found = [f"{path.relative_to(REPO)}:{line}: {text}" for package in PACKAGES
             for path in sorted((pathlib.Path(REPO) / package).rglob("*.py"))
             for line, text in timed_comments(path.read_text(encoding="utf-8"))]
    assert found == [], "timings in comments (move them to docs/BENCHMARKS.md and cite it):\n" + "\n".join(found)


def test_a_timing_in_a_comment_is_caught():
    source = ("# workers import Beam again (~5 s per stage, measured)\nX = 1  # 0.4 CPU-s\n"
              "TIMEOUT_S = 30  # the limit, in seconds\n# 3 stages, 2 files, 16 MB\n")
    assert [line for line, _ in timed_comments(source)] == [1, 2]
