"""No import cycle between product modules, lazy imports counted (issue 29).

Every product module (model_contract/, transforms/, pipeline/, trainer/) is parsed with `ast`; every import
statement in it - at the top, inside a function, under `if TYPE_CHECKING` alike - is an arrow to the product
module it names, and so is `importlib.import_module("constant.name")`. Importing a module runs the `__init__.py`
of every package above it first, so that is an arrow too (review29: a cycle through a package's `__init__` was
missed). A lazy import only postpones a cycle to run time (the module must still be importable from both ends),
so it counts. A cycle found is printed module by module.
"""
from __future__ import annotations

import ast
import pathlib

from tests.conftest import REPO

PACKAGES = ("model_contract", "transforms", "pipeline", "trainer")


def product_modules(root: pathlib.Path) -> dict:
    """Dotted module name -> file, for every .py file of the product packages (a package is its __init__)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _resolve(name: str, modules: dict):
    """The product module `name` is or lies in (`pipeline.ops.commit.publish` -> pipeline.ops.commit)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def imported_modules(module: str, path: pathlib.Path, modules: dict, root: pathlib.Path) -> set:
    """The product modules every import statement of `module` names: `from a.b import c` names a.b.c when c is
    a module, else a.b; relative imports are resolved against the module's package."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names, tree = [], ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names += [f"{base}.{a.name}" if f"{base}.{a.name}" in modules or _native(root, f"{base}.{a.name}")
                      else base for a in node.names]
    names += constant_dynamic_imports(tree)
    found = {_resolve(n, modules) for n in names if n.split(".")[0] in PACKAGES and not _native(root, n)}
    # Importing a.b.c runs a/__init__.py and a/b/__init__.py first: an arrow to each package above the module
    # imported, except the importer's own packages (already running when it runs).
    own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)}
    found |= {parent for m in found - {None} for parent in _packages_above(m) if parent in modules} - own
    return found - {None, module}


def _packages_above(module: str) -> list:
    """`pipeline.shard.plan` -> [pipeline, pipeline.shard]."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def constant_dynamic_imports(tree: ast.AST) -> list:
    """Module names given as a constant to `importlib.import_module(...)` or `__import__(...)`: an import statement
    in all but syntax (review29)."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func, first = node.func, node.args[0]
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in ("import_module", "__import__") and isinstance(first, ast.Constant) \
                and isinstance(first.value, str) and not first.value.startswith("."):
            out.append(first.value)
    return out


def _native(root: pathlib.Path, name: str) -> bool:
    """A compiled extension module of a product package (model_contract/_varint.c): no Python imports of its own,
    so no arrow; `from model_contract import _varint` does not import the package's other names."""
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".c").is_file() or any(path.parent.glob(path.name + ".*.so"))


def import_graph(root: pathlib.Path) -> dict:
    modules = product_modules(root)
    return {m: imported_modules(m, p, modules, root) for m, p in modules.items()}


def cycles(graph: dict) -> list:
    """One cycle (a list of modules, the first repeated at the end) per strongly connected component of more
    than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, sccs = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                scc = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    scc.append(m)
                    if m == node:
                        break
                if len(scc) > 1:
                    sccs.append(set(scc))
    return [_one_cycle(graph, scc) for scc in sccs]


def _one_cycle(graph: dict, scc: set) -> list:
    """A shortest path inside `scc` from its first module back to it (breadth first)."""
    first = min(scc)
    previous, frontier = {first: None}, [first]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & scc):
                if child == first:
                    path = [node]
                    while previous[path[-1]] is not None:
                        path.append(previous[path[-1]])
                    return [first] + path[::-1][1:] + [first]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{sorted(scc)} is not strongly connected")


def test_the_cycle_finder_finds_lazy_imports_and_prints_the_cycle(tmp_path):
    pkg = tmp_path / "pipeline"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pipeline.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..c import g  # lazy, relative\n")
    (pkg / "c.py").write_text("import pipeline.a.thing\ndef g(): pass\n")
    (pkg / "d.py").write_text("from pipeline import a\n")  # into the cycle, not part of it
    assert cycles(import_graph(tmp_path)) == [["pipeline.a", "pipeline.sub.b", "pipeline.c", "pipeline.a"]]
    (pkg / "c.py").write_text("def g(): pass\n")
    assert cycles(import_graph(tmp_path)) == []


def test_no_module_level_import_cycle_lazy_imports_included():
    found = cycles(import_graph(pathlib.Path(REPO)))
    assert not found, "import cycles (lazy imports counted):\n" + "\n".join(" -> ".join(c) for c in found)


def _tree(root: pathlib.Path, files: dict) -> pathlib.Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_cycle_through_importlib_with_a_constant_name_is_found(tmp_path):
    """review29: `importlib.import_module("pipeline.a")` is an import statement in all but syntax; missed."""
    _tree(tmp_path, {"pipeline/__init__.py": "", "pipeline/x.py": "from pipeline import y\n",
                     "pipeline/y.py": "import importlib\ndef f():\n    return importlib.import_module('pipeline.x')\n"})
    assert cycles(import_graph(tmp_path)) == [["pipeline.x", "pipeline.y", "pipeline.x"]]


def test_a_cycle_through_a_package_init_is_found(tmp_path):
    """review29: importing pipeline.shard.y runs the package's __init__.py first; when that imports pipeline.x,
    which imports pipeline.shard.y, the modules form a cycle at import time, but only the arrow to y was drawn."""
    _tree(tmp_path, {"pipeline/__init__.py": "", "pipeline/shard/__init__.py": "from pipeline import x\n",
                     "pipeline/shard/y.py": "Y = 1\n", "pipeline/x.py": "from pipeline.shard.y import Y\n"})
    assert cycles(import_graph(tmp_path)) == [["pipeline.shard", "pipeline.x", "pipeline.shard"]]
