"""Only pipeline/cli.py writes to stdout in the service: every other module returns text or logs, so a
command's output is one place to read (and a library caller gets no stray lines)."""
from __future__ import annotations

import ast
import pathlib

from tests.conftest import REPO

PRINTER = pathlib.Path("pipeline/cli.py")


def _prints(path: pathlib.Path) -> list:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"]


def test_no_module_of_the_service_but_the_cli_prints():
    root = pathlib.Path(REPO)
    found = {str(p.relative_to(root)): _prints(p) for p in sorted((root / "pipeline").rglob("*.py"))
             if p.relative_to(root) != PRINTER}
    assert {path: lines for path, lines in found.items() if lines} == {}
    assert _prints(root / PRINTER), "the CLI is where printing happens"
