"""Only pipeline/cli.py and its printing helpers (pipeline/output.py, which the library forms of the commands
share) write to stdout in the service: every other module returns text or logs, so a command's output is one
place to read (and a library caller gets no stray lines)."""
from __future__ import annotations

import ast
import pathlib

from tests.conftest import REPO

PRINTERS = (pathlib.Path("pipeline/cli.py"), pathlib.Path("pipeline/output.py"))


def _prints(path: pathlib.Path) -> list:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"]


def test_no_module_of_the_service_but_the_cli_prints():
    root = pathlib.Path(REPO)
    found = {str(p.relative_to(root)): _prints(p) for p in sorted((root / "pipeline").rglob("*.py"))
             if p.relative_to(root) not in PRINTERS}
    assert {path: lines for path, lines in found.items() if lines} == {}
    assert all(_prints(root / p) for p in PRINTERS), "the CLI and its helpers are where printing happens"
