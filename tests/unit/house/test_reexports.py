"""No re-exports in the shard job's modules: every name a module imports is used by that module.

A name imported only so that others can reach it through the importer (`shard_pipeline.default_beam_args`,
`pipeline.config.ConfigError`) hides the name's home and lets the importer's imports become an API of their own;
the s37 review found three (pipeline/shard/shard_pipeline.py: default_beam_args, MODEL_FILE_NAME; pipeline/config.py:
ConfigError, whose home is pipeline/errors.py). Callers import a name from the module that defines it.
Scope: the modules below; other packages' re-exports (transforms/tokenize's backends, pipeline/beam_glue.py) are
their packages' documented surfaces and are not checked here.
"""
from __future__ import annotations

import ast

from tests.conftest import REPO

CHECKED = sorted((REPO / "pipeline" / "shard").rglob("*.py")) + [REPO / "pipeline" / "config.py"]


def unused_imports(source: str) -> list:
    """Names imported at a module's top level (outside `if TYPE_CHECKING`) that the module itself never reads."""
    tree = ast.parse(source)
    imported = {}
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "module", None) != "__future__":
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                imported[name] = node.lineno
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    read |= {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    # names in string annotations and __all__ entries count as read (a string naming it is a use the reader sees)
    read |= {w for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             for w in n.value.replace("[", " ").replace("]", " ").replace(",", " ").replace(".", " ").split()}
    return [f"line {line}: {name}" for name, line in sorted(imported.items(), key=lambda kv: kv[1]) if name not in read]


def test_the_shard_modules_and_the_config_re_export_nothing():
    assert len(CHECKED) > 10 and CHECKED[-1].name == "config.py"
    found = {str(p.relative_to(REPO)): unused_imports(p.read_text()) for p in CHECKED}
    bad = {path: names for path, names in found.items() if names}
    assert not bad, f"imported but not used by the importer (import them from their home instead): {bad}"


def defined_names(source: str) -> set:
    """What a module defines at its top level: functions, classes and assigned names (not what it imports)."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def reached_through(sources: dict, homes: dict) -> list:
    """`from M import N` (in any of `sources`: path -> text) where M is one of `homes` (module -> its text) and N
    is not defined in M: a name reached through a module that only imports it."""
    defined = {module: defined_names(text) for module, text in homes.items()}
    found = []
    for path, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module in defined:
                found += [f"{path}:{node.lineno}: {node.module}.{a.name}" for a in node.names
                          if a.name not in defined[node.module]]
    return found


def test_no_name_is_imported_through_the_config_or_a_shard_module():
    homes = {".".join(p.relative_to(REPO).with_suffix("").parts): p.read_text() for p in CHECKED}
    assert "pipeline.config" in homes and "pipeline.shard.shard_pipeline" in homes
    sources = {str(p.relative_to(REPO)): p.read_text() for top in ("pipeline", "transforms", "trainer",
                                                                    "model_contract", "tests", "bench")
               for p in sorted((REPO / top).rglob("*.py"))}
    assert not reached_through(sources, homes), reached_through(sources, homes)


def test_a_re_export_is_caught():
    """The check itself can fail: a name imported for others, beside one the module uses."""
    source = "from pipeline.errors import ConfigError, RunError\n\ndef f():\n    raise RunError('x')\n"
    assert unused_imports(source) == ["line 1: ConfigError"]
    home = "from pipeline.errors import ConfigError\n\nclass ShardConfig:\n    pass\n"
    user = "from pipeline.config import ConfigError, ShardConfig\n"
    assert reached_through({"user.py": user}, {"pipeline.config": home}) == ["user.py:1: pipeline.config.ConfigError"]
