"""Field checks for everything read back from a manifest: one ContractError naming the field path.

Manifests are read by `verify`, `inspect`, `report`, the trainer and later runs (which delete by what they
read), and a hand-edited or damaged one must fail on load in one line that names the field
(`shards[3].sha256: expected a 64-hex string, got 12`), not as a KeyError or TypeError deep in a command, and
never pass with a count of -5. The records of model_contract/manifest_rows.py and model_contract/retrieval.py call
these from their `from_dict`; each check returns the value unchanged, so the JSON written back is unchanged.
"""
from __future__ import annotations

import math
import re

from model_contract.contract import ContractError

_SHA256 = re.compile(r"[0-9a-f]{64}")

# The only form a generation directory's name takes (pipeline/config.py `fingerprint`): `gen-` + 16 hex digits.
# Names are read back from the manifest to decide what to delete, so anything else is refused, never resolved.
GENERATION_PATTERN = re.compile(r"gen-[0-9a-f]{16}")


def is_generation_name(name) -> bool:
    return isinstance(name, str) and GENERATION_PATTERN.fullmatch(name) is not None


def check_generation_name(name, what: str = "generation") -> str:
    """`name` if it is a generation directory name of the exact generated form, else ContractError."""
    if not is_generation_name(name):
        raise ContractError(f"manifest {what} {name!r} is not a generation name (gen-<16 hex digits>); refusing a "
                            "damaged or hand-edited manifest")
    return name


def check_relative_path(rel, what: str = "path") -> str:
    """`rel` if it is a relative path that stays inside the dataset directory, else ContractError.

    Manifest paths are relative to the manifest (model_contract/dataset_paths.py); an absolute path, a `..`
    component, an empty component, a backslash or a URL would let a damaged manifest point readers (or
    deletions) elsewhere.
    """
    ok = isinstance(rel, str) and rel and "\\" not in rel and "://" not in rel and "\x00" not in rel
    parts = rel.split("/") if ok else []
    if not ok or rel.startswith("/") or any(p in ("", ".", "..") for p in parts) or re.match(r"[A-Za-z]:", rel):
        raise ContractError(f"manifest {what} {rel!r} is not a relative path inside the dataset directory; refusing "
                            "a damaged or hand-edited manifest")
    return rel


class SchemaError(ContractError):
    """A manifest field of the wrong type or range; the message names its path."""

    def __init__(self, what: str, path: str, expected: str, value, missing: bool = False):
        shown = repr(value)
        got = "it is missing" if missing else f"got {shown if len(shown) <= 80 else shown[:77] + '...'}"
        super().__init__(f"{what} {path}: expected {expected}, {got}")
        self.path = path


class Fields:
    """Checks on one object's fields, each error naming `<what> <prefix>.<field>`."""

    def __init__(self, d, prefix: str, what: str = "manifest"):
        self.what, self.prefix = what, prefix
        if not isinstance(d, dict):
            raise SchemaError(what, prefix or "(top level)", "an object", d)
        self.d = d

    def path(self, key) -> str:
        return f"{self.prefix}.{key}" if self.prefix else str(key)

    def fail(self, key, expected: str, value=None):
        raise SchemaError(self.what, self.path(key), expected, self.d.get(key) if value is None else value)

    def _get(self, key, required: bool):
        if key not in self.d:
            if required:
                raise SchemaError(self.what, self.path(key), "a value", None, missing=True)
            return None, False
        return self.d[key], True

    def count(self, key, required: bool = True, nullable: bool = False):
        """A non-negative integer (JSON booleans are not counts)."""
        v, present = self._get(key, required)
        if present and not (nullable and v is None) and not is_count(v):
            self.fail(key, "a count (an integer >= 0)")
        return v

    def positive(self, key, required: bool = True):
        v, present = self._get(key, required)
        if present and (not is_count(v) or v < 1):
            self.fail(key, "an integer >= 1")
        return v

    def integer(self, key, required: bool = True):
        v, present = self._get(key, required)
        if present and (not isinstance(v, int) or isinstance(v, bool)):
            self.fail(key, "an integer")
        return v

    def number(self, key, required: bool = True, lo=None, hi=None):
        v, present = self._get(key, required)
        if present:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not ok or (lo is not None and v < lo) or (hi is not None and v > hi):
                rng = f" in [{lo}, {hi}]" if lo is not None and hi is not None else ""
                self.fail(key, f"a finite number{rng}")
        return v

    def string(self, key, required: bool = True, nullable: bool = False):
        v, present = self._get(key, required)
        if present and not isinstance(v, str) and not (nullable and v is None):
            self.fail(key, "a string")
        return v

    def sha256(self, key, required: bool = True):
        v, present = self._get(key, required)
        if present and not is_sha256(v):
            self.fail(key, "a 64-hex string")
        return v

    def obj(self, key, required: bool = True) -> "Fields":
        v, present = self._get(key, required)
        return Fields(v if present else {}, self.path(key), self.what)

    def items(self, key, required: bool = True) -> list:
        """(path, element) of a list field."""
        v, present = self._get(key, required)
        if not present:
            return []
        if not isinstance(v, list):
            self.fail(key, "a list")
        return [(f"{self.path(key)}[{i}]", e) for i, e in enumerate(v)]

    def counts(self, key, required: bool = True) -> dict:
        """An object of name -> count (filtered / dead-lettered reasons, duplicates per source)."""
        sub = self.obj(key, required)
        for name in sub.d:
            sub.count(name)
        return sub.d


def is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def is_sha256(v) -> bool:
    return isinstance(v, str) and _SHA256.fullmatch(v) is not None
