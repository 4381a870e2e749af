"""Issue 29 (P5): no doc or comment names a path that no longer exists.

Every tracked doc (docs/*.md except docs/wip/, README.md) and every product or test module is scanned for a repo
path (`pipeline/...py`, `transforms/...py`, `tests/...py`, `docs/...md`, ...); each must exist. A path a doc names
as deleted on purpose ("removed", "gone", "deleted" on the same line) is allowed, and so are the made-up paths of
a test's own fixtures (tests/unit/house/test_rooms.py's `x.py`/`y.py`).

Found by the issue 29 review: docs and a test's docstring still named the modules the refactor split or moved
(transforms/shard/stages.py, tests/unit/tools/test_verify.py; the first spelled here as a deleted one).
tests/unit/house/test_doc_paths.py checks the docs' paths, symbols and sections; this test adds the comments and
docstrings of code and tests.
"""
from __future__ import annotations

import re
import subprocess

from tests.conftest import REPO

PATH = re.compile(r"(?<![\w/.-])((?:pipeline|transforms|model_contract|trainer|tests|bench|docs)/[\w/.-]*\w"
                  r"\.(?:py|md|c|sh|toml))")
DELETED_ON_PURPOSE = re.compile(r"\b(removed|gone|deleted)\b")
FIXTURE_NAMES = re.compile(r"/[xy]\.py$")
# test_doc_paths.py's self-tests name dead paths on purpose
SELF_TESTS = {"tests/unit/house/test_named_paths_exist.py", "tests/unit/house/test_doc_paths.py"}


def scanned_files() -> list:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [f for f in tracked.split() if (f.endswith(".py") or f.endswith(".md")) and not f.startswith("docs/wip/")
            and f not in SELF_TESTS]


def dead_paths() -> list:
    found = []
    for name in scanned_files():
        path = REPO / name
        if not path.is_file():
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if DELETED_ON_PURPOSE.search(line):
                continue
            for m in PATH.finditer(line):
                if not (REPO / m.group(1)).exists() and not FIXTURE_NAMES.search(m.group(1)):
                    found.append(f"{name}:{lineno}: {m.group(1)}")
    return found


def test_every_path_a_doc_or_comment_names_exists():
    assert dead_paths() == []
