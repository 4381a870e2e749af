"""The rooms of docs/DESIGN.md ("Rooms") and what each may import, checked on every import statement of the
product code (top-level and the lazy ones inside functions alike): a new arrow between rooms fails here by
file and room."""
from __future__ import annotations

import ast
import pathlib

from tests.conftest import REPO
from tests.unit.house.test_import_cycles import constant_dynamic_imports

PACKAGES = ("model_contract", "transforms", "pipeline", "trainer")
TRANSFORMS = {"transforms/io", "transforms/tokenize", "transforms/shard", "transforms/retrieval"}
# room -> the other rooms it may import (docs/DESIGN.md "Rooms" is the same table in words)
ALLOWED = {
    "model_contract": set(),
    "transforms/io": {"model_contract", "transforms/shard"},
    "transforms/tokenize": {"model_contract"},
    "transforms/shard": {"model_contract", "transforms/io", "transforms/tokenize"},
    "transforms/retrieval": {"model_contract"},
    "pipeline": {"model_contract", "pipeline/ops", "pipeline/shard", "pipeline/retrieval", "pipeline/tools",
                 *TRANSFORMS},
    "pipeline/ops": {"model_contract", "pipeline", "pipeline/shard", *TRANSFORMS},
    "pipeline/shard": {"model_contract", "pipeline", "pipeline/ops", *TRANSFORMS},
    "pipeline/retrieval": {"model_contract", "pipeline", "pipeline/ops", "pipeline/shard", *TRANSFORMS},
    "pipeline/tools": {"model_contract", "pipeline", "pipeline/ops", "pipeline/shard", *TRANSFORMS},
    "trainer": {"model_contract"},
}
# pipeline/ops reaches into the shard room for one module only: the committed dataset's state.
OPS_INTO_SHARD = {"pipeline.shard.integrity"}


def room_of(module: str, root: pathlib.Path) -> str:
    """`pipeline.shard.plan` -> pipeline/shard; a top-level module of a package is the package's room."""
    parts = module.split(".")
    if parts[0] in ("model_contract", "trainer"):
        return parts[0]
    if len(parts) > 1 and (root / parts[0] / parts[1]).is_dir():
        return f"{parts[0]}/{parts[1]}"
    return parts[0]


def imports_of(path: pathlib.Path, root: pathlib.Path = REPO) -> list:
    """Every product module or package an import statement in `path` names (`from a.b import c` names a.b
    and a.b.c: c may be a module); relative imports resolved against the file's package, and the constant names
    given to `importlib.import_module` (review29: both were missed)."""
    rel = path.relative_to(root).with_suffix("").parts
    package = list(rel[:-1])  # a module's package; a package's __init__ is in its own folder, the same list
    tree, out = ast.parse(path.read_text(encoding="utf-8"), str(path)), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - (node.level - 1)] + ([base] if base else []))
            out += [base] + [f"{base}.{a.name}" for a in node.names]
    out += constant_dynamic_imports(tree)
    return [n for n in out if n.split(".")[0] in PACKAGES]


def arrows(root: pathlib.Path) -> list:
    """(file, its room, imported module, that module's room) for every import between two rooms."""
    out = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            src = room_of(".".join(rel.with_suffix("").parts), root) if rel.name != "__init__.py" \
                else room_of(".".join(rel.parent.parts) + ".x", root)
            for name in imports_of(path, root):
                dst = room_of(name, root)
                # a room in no row of the table is refused too (a module at a package's top, transforms/x.py),
                # but not a package named on its way to a room (`from transforms import shard`)
                if dst != src and (dst in ALLOWED or not root.joinpath(*name.split(".")).is_dir()):
                    out.append((str(rel), src, name, dst))
    return out


def forbidden(found: list) -> list:
    bad = [a for a in found if a[3] not in ALLOWED.get(a[1], set())]  # a room not in the table may import none
    bad += [a for a in found if a[1] == "pipeline/ops" and a[3] == "pipeline/shard"
            and a[2] not in OPS_INTO_SHARD | {"pipeline.shard"}]
    return bad


def test_every_import_between_rooms_is_one_the_table_allows():
    found = arrows(pathlib.Path(REPO))
    assert ("pipeline/shard/plan.py", "pipeline/shard", "pipeline.ops.commit", "pipeline/ops") in found
    assert forbidden(found) == []


def test_a_forbidden_arrow_is_caught():
    """The check itself can fail: transforms/ importing pipeline/, the trainer importing transforms/."""
    found = [("transforms/shard/x.py", "transforms/shard", "pipeline.config", "pipeline"),
             ("trainer/x.py", "trainer", "transforms.io.io_utils", "transforms/io"),
             ("pipeline/ops/x.py", "pipeline/ops", "pipeline.shard.plan", "pipeline/shard"),
             ("pipeline/ops/y.py", "pipeline/ops", "pipeline.shard.integrity", "pipeline/shard")]
    assert [a[0] for a in forbidden(found)] == ["transforms/shard/x.py", "trainer/x.py", "pipeline/ops/x.py"]


def test_relative_importlib_and_top_level_module_arrows_are_seen(tmp_path):
    """review29: `from ..shard import records` in transforms/retrieval/ (relative),
    `importlib.import_module("pipeline.config")` and an import of a module at a package's top (transforms/x.py:
    room `transforms`, in no row of the table) were not arrows, so rooms could import what the table forbids
    unseen."""
    files = {"transforms/__init__.py": "", "transforms/x.py": "X = 1\n",
             "transforms/shard/__init__.py": "", "pipeline/__init__.py": "", "pipeline/config.py": "Y = 2\n",
             "transforms/retrieval/__init__.py": "", "transforms/shard/records.py": "Z = 3\n",
             "transforms/retrieval/x.py": "from ..shard import records\n",
             "transforms/shard/y.py": "import importlib\nconfig = importlib.import_module('pipeline.config')\n",
             "trainer/__init__.py": "", "trainer/y.py": "from transforms.x import X\n",
             "model_contract/__init__.py": ""}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    bad = {a[0] for a in forbidden(arrows(tmp_path))}
    assert bad == {"transforms/retrieval/x.py", "transforms/shard/y.py", "trainer/y.py"}, bad
