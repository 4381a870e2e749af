"""No dataclass field of the product code is annotated with a bare container (issue 29: "75 dataclass fields are
bare list/dict"; records handed between modules carry parameterised types).

Every product module (model_contract/, pipeline/, transforms/, trainer/) is parsed with `ast`; in every class
decorated `@dataclass` / `@dataclasses.dataclass(...)`, each annotated field's annotation is walked: a `list`,
`dict`, `tuple`, `set`, `frozenset` (or typing's `List`, `Dict`, ...) that is not subscripted fails, wherever it
stands (`list`, `Optional[dict]`, `list | None`, `dict[str, list]` alike). String annotations are parsed too.
`ClassVar[...]` is not a field and is skipped. A failure names file:Class.field.
"""
from __future__ import annotations

import ast
import pathlib

from tests.conftest import REPO

PACKAGES = ("model_contract", "transforms", "pipeline", "trainer")
BARE = {"list", "dict", "tuple", "set", "frozenset", "List", "Dict", "Tuple", "Set", "FrozenSet"}
# owned by work in progress; empty it. Every package above is typed and scanned (issue 29).
PENDING: set[str] = set()


def _is_dataclass(node: ast.ClassDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if name == "dataclass":
            return True
    return False


def _name(node: ast.expr):
    """`list` -> list, `typing.List` -> List, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def bare_containers(annotation: ast.expr) -> list:
    """The bare container names anywhere in `annotation` (a subscripted one's parameters are walked, itself not)."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return bare_containers(ast.parse(annotation.value, mode="eval").body)
    if isinstance(annotation, ast.Subscript):  # Literal["125M"] holds values, not types
        return [] if _name(annotation.value) == "Literal" else bare_containers(annotation.slice)
    if isinstance(annotation, ast.BinOp):
        return bare_containers(annotation.left) + bare_containers(annotation.right)
    if isinstance(annotation, ast.Tuple):
        return [n for elt in annotation.elts for n in bare_containers(elt)]
    name = _name(annotation)
    return [name] if name in BARE else []


def bare_fields(source: str, filename: str) -> list:
    """`Class.field` for every dataclass field of `source` with a bare container in its annotation."""
    out = []
    for node in ast.walk(ast.parse(source, filename)):
        if not (isinstance(node, ast.ClassDef) and _is_dataclass(node)):
            continue
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            ann = stmt.annotation
            head = ann.value if isinstance(ann, ast.Subscript) else ann
            if _name(head) == "ClassVar":
                continue
            if bare_containers(ann):
                out.append(f"{node.name}.{stmt.target.id}")
    return out


def _pending(rel: str) -> bool:
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in PENDING)


def scan(root: pathlib.Path) -> list:
    """file:Class.field for every bare container field of the product modules outside PENDING."""
    out = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if not _pending(rel):
                out += [f"{rel}:{f}" for f in bare_fields(path.read_text(encoding="utf-8"), rel)]
    return out


def test_no_dataclass_field_is_a_bare_container():
    found = scan(pathlib.Path(REPO))
    assert found == [], "dataclass fields with a bare container annotation (parameterise them):\n" + "\n".join(found)


def test_a_bare_field_is_caught_wherever_it_stands():
    """The scan itself can fail: bare, Optional, union, nested, string and typing forms; ClassVar, parameterised
    fields and non-dataclasses pass."""
    source = '''
import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Dict, Optional

@dataclass(frozen=True)
class A:
    a: list
    b: Optional[dict] = None
    c: tuple | None = None
    d: dict[str, list] = field(default_factory=dict)
    e: "set" = field(default_factory=set)
    f: Dict = field(default_factory=dict)
    ok1: list[int] = field(default_factory=list)
    ok2: dict[str, tuple[int, ...]] = field(default_factory=dict)
    ok3: ClassVar[list] = []

@dataclasses.dataclass
class B:
    g: frozenset = frozenset()

class NotADataclass:
    h: list = []
'''
    assert bare_fields(source, "x.py") == ["A.a", "A.b", "A.c", "A.d", "A.e", "A.f", "B.g"]


def test_pending_names_only_files_that_exist():
    """A PENDING entry that no longer matches a file would hide nothing and should go."""
    root = pathlib.Path(REPO)
    for entry in PENDING:
        assert (root / entry).exists(), entry
