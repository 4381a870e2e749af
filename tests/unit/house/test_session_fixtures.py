"""No test module imports a session-scoped fixture (tests/e2e/conftest.py says why: each importing module would
get its own, a cluster per module held to the session's end); a conftest registers it once."""
from __future__ import annotations

import ast
import importlib
import pathlib

from tests.conftest import REPO


def session_fixtures_imported(test_file: pathlib.Path) -> list:
    """'module.name' for every session-scoped fixture `test_file` imports from a tests.* module."""
    found = []
    for node in ast.walk(ast.parse(test_file.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
            module = importlib.import_module(node.module)
            for alias in node.names:
                marker = getattr(getattr(module, alias.name, None), "_fixture_function_marker", None)
                if marker is not None and marker.scope == "session":
                    found.append(f"{node.module}.{alias.name}")
    return found


def test_no_test_module_imports_a_session_scoped_fixture():
    offenders = {str(p.relative_to(REPO)): names for p in sorted((REPO / "tests").rglob("test_*.py"))
                 if (names := session_fixtures_imported(p))}
    assert offenders == {}, "register these in a conftest.py instead (tests/e2e/conftest.py)"


def test_the_check_sees_an_imported_session_fixture(tmp_path):
    test_file = tmp_path / "test_x.py"
    test_file.write_text("from tests.engines_clusters import spark_cluster, shard_args\n")
    assert session_fixtures_imported(test_file) == ["tests.engines_clusters.spark_cluster"]
