"""A fast JSON parse whose result is used only where it provably equals the strict parser's.

The strict parser (`loads_strict` in transforms/shard/documents.py) is json.loads with hooks that name every
failure (duplicate keys, numbers past Python's 4,300-digit int limit, nesting past the recursion limit, invalid
UTF-8, lone surrogates, ...); it reads about 250 MB/s. simdjson (pysimdjson) parses the same grammar several
times faster but accepts some things silently, so `loads_proven` returns its value only when that value is
the strict parser's, and `UNPROVEN` otherwise; the caller then runs the strict parser, which gives the verdict
and its reason exactly as without this module:

- simdjson refuses (any exception): UNPROVEN. That covers every strict failure simdjson also refuses (invalid
  UTF-8, encoded surrogates, lone surrogate escapes, NaN/Infinity, control characters, trailing data,
  integers outside 64 bits, nesting past 1,024) and the inputs that strict accepts and simdjson does not
  (NaN, 1e400, integers of 20 to 4,300 digits): strict decides them all. An accepted integer fits in 64 bits,
  far under the strict 4,300-digit limit, and floats parse to the same doubles.
- duplicate keys: simdjson's document keeps every member, so an object whose key list repeats a key is
  UNPROVEN (strict dead-letters it `duplicate_key`); its dict value would have kept the last one silently.
- depth: a value nested deeper than MAX_DEPTH is UNPROVEN, so the strict parser's recursion limit (which
  depends on the caller's stack) decides every deep record exactly as it does without the fast path.
tests/unit/io/test_fast_json.py runs the fuzz corpus of tests/unit/io/test_fuzz_inputs.py through both.
"""
from __future__ import annotations

import threading

try:
    import simdjson
except ImportError:  # pragma: no cover - a pinned dependency (pyproject.toml); without it every record is strict
    simdjson = None

UNPROVEN = object()
_Object = simdjson.Object if simdjson is not None else None
_Array = simdjson.Array if simdjson is not None else None
# Far below the strict parser's limit (Python's recursion limit, ~1,000 frames) whatever the caller's stack.
MAX_DEPTH = 64
# A parser keeps the buffers of the largest document it has read; longer lines use a parser of their own that
# is freed with them, so a worker does not hold a 64 MiB line's buffers for the rest of its life.
REUSE_MAX_BYTES = 4 << 20

_local = threading.local()  # one parser per thread: a simdjson parser holds one document at a time


def loads_proven(data: bytes):
    """simdjson's value of `data` when it is what the strict parser returns; else UNPROVEN."""
    if simdjson is None:
        return UNPROVEN
    if len(data) > REUSE_MAX_BYTES:
        parser = simdjson.Parser()
    else:
        parser = getattr(_local, "parser", None)
        if parser is None:
            parser = _local.parser = simdjson.Parser()
    try:
        return _value(parser.parse(data), 1)
    except _Unproven:
        return UNPROVEN
    except Exception:  # noqa: BLE001 - any refusal is the strict parser's to name
        _local.parser = None  # a failed parse may leave the parser held by the exception's frames
        return UNPROVEN


class _Unproven(Exception):
    pass


def _value(node, depth: int):
    """The Python value of a simdjson document node, built as it is checked: raises _Unproven for an object
    that repeats a key, or for nesting deeper than MAX_DEPTH. (Item access gives simdjson's own nodes, so
    every member is looked at once; `values()` would convert nested objects with duplicates already lost.)"""
    kind = type(node)
    if kind is _Object:
        if depth > MAX_DEPTH:
            raise _Unproven()
        keys = list(node.keys())
        out = {}
        for key in keys:
            out[key] = _value(node[key], depth + 1)
        if len(out) != len(keys):
            raise _Unproven()
        return out
    if kind is _Array:
        if depth > MAX_DEPTH:
            raise _Unproven()
        return [_value(item, depth + 1) for item in node]
    return node  # str, int, float, bool or None, already converted
