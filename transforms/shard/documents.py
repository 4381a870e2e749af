"""From a raw JSON line to a validated document, or a reason why not; stable document ids and splits.

Every outcome is explicit: a `Document`, a `Rejection(kind="filtered")` for valid records we choose not to
train on (empty text), or a `Rejection(kind="dead_letter")` for records that are broken. Nothing is dropped
silently, so read = written + filtered + dead-lettered reconciles exactly.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Sequence, Union

from model_contract.hashing import hash64
from transforms.io.fast_json import UNPROVEN, loads_proven
from transforms.io.read_records import excerpt_of

# Keys of model_contract/hashing.py `hash64`: one per use, so a document's id, split and order are independent.
ID_KEY = b"pileprep-doc"
SPLIT_ORDER_KEY = b"pileprep-key"

FILTERED = "filtered"
DEAD_LETTER = "dead_letter"
UNKNOWN_SOURCE = "unknown"
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Document:
    doc_id: int  # 63-bit, stable: a hash of the text alone (same text, same id, whatever the source)
    text: str
    source: str


@dataclass(frozen=True)
class Rejection:
    kind: str  # FILTERED | DEAD_LETTER
    reason: str
    excerpt: str = ""


ParseResult = Union[Document, Rejection]


def document_id(text: str) -> int:
    """63-bit content id of the text alone (docs/DESIGN.md, "Document identity"): stable across runs, machines and
    file moves, and the same text under two sources is one document, so exact duplicates share it wherever they
    come from and can never be trained on twice or sit in two splits."""
    return document_id_of_utf8(text.encode("utf-8"))


def document_id_of_utf8(data: bytes) -> int:
    """document_id of the text whose UTF-8 bytes are `data` (parse_record has them already)."""
    return hash64(ID_KEY, data) >> 1


def lookup_field(obj: dict, dotted: str, missing=None):
    """The value at a dotted path (`meta.pile_set_name`) in nested dicts, or `missing` when any part is absent."""
    cur = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return missing
        cur = cur[part]
    return cur


_lookup = lookup_field


class _NumberTooLong(Exception):
    pass


class _DuplicateKey(Exception):
    pass


def _parse_int(digits: str) -> int:
    try:  # Python >= 3.11 refuses int() of more than sys.get_int_max_str_digits() (4,300) digits
        return int(digits)
    except ValueError:
        raise _NumberTooLong() from None


def _unique_pairs(pairs: list) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # json.loads would keep the last value silently: the record is ambiguous
        raise _DuplicateKey()
    return obj


def loads_strict(data: bytes):
    """json.loads that refuses what plain json.loads accepts silently (duplicate keys) and raises one named
    exception per kind of failure, so every outcome below has its own dead-letter reason."""
    return json.loads(data, parse_int=_parse_int, object_pairs_hook=_unique_pairs)


def loads_record(data: bytes):
    """loads_strict's value, by the fast parser where transforms/io/fast_json.py proves it the same."""
    value = loads_proven(data)
    return loads_strict(data) if value is UNPROVEN else value


def parse_record(data: bytes, text_field: str = "text",
                 source_fields: Sequence[str] = ("meta.pile_set_name",)) -> ParseResult:
    """Parse one JSON line into a Document; the first source field present (a string) names the source.

    Never raises on bad data: every parser failure is a dead letter with its own reason (invalid_utf8,
    invalid_json, json_too_deep, number_too_long, duplicate_key, or parse_error for anything else)."""
    if not data.strip():
        return Rejection(FILTERED, "blank_line")
    try:
        record = loads_record(data)
    except UnicodeDecodeError:
        return Rejection(DEAD_LETTER, "invalid_utf8", excerpt_of(data))
    except _NumberTooLong:
        return Rejection(DEAD_LETTER, "number_too_long", excerpt_of(data))
    except _DuplicateKey:
        return Rejection(DEAD_LETTER, "duplicate_key", excerpt_of(data))
    except RecursionError:  # valid JSON nested deeper than the parser's recursion limit
        return Rejection(DEAD_LETTER, "json_too_deep", excerpt_of(data))
    except json.JSONDecodeError:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return Rejection(DEAD_LETTER, "invalid_utf8", excerpt_of(data))
        return Rejection(DEAD_LETTER, "invalid_json", excerpt_of(data))
    except Exception:  # noqa: BLE001 - one bad record never fails the run; the reason says it was unexpected
        return Rejection(DEAD_LETTER, "parse_error", excerpt_of(data))
    if not isinstance(record, dict):
        return Rejection(DEAD_LETTER, "not_a_json_object", excerpt_of(data))
    if not _is_present(record, text_field):
        return Rejection(DEAD_LETTER, "text_missing", excerpt_of(data))
    text = _lookup(record, text_field)
    if text is None:
        return Rejection(DEAD_LETTER, "text_null", excerpt_of(data))
    if not isinstance(text, str):
        return Rejection(DEAD_LETTER, "text_not_a_string", excerpt_of(data))
    try:
        utf8 = text.encode("utf-8")  # kept for the id: one UTF-8 copy of the text, not two
    except UnicodeEncodeError:  # lone surrogates from "\ud800"-style escapes cannot be tokenized faithfully
        return Rejection(DEAD_LETTER, "lone_surrogate", excerpt_of(data))
    if not text.strip():
        return Rejection(FILTERED, "empty_text", excerpt_of(data))
    source = _source_of(record, source_fields)
    return Document(document_id_of_utf8(utf8), text, source)


def _is_present(obj: dict, dotted: str) -> bool:
    parent, _, last = dotted.rpartition(".")
    holder = _lookup(obj, parent) if parent else obj
    return isinstance(holder, dict) and last in holder


def _source_of(record: dict, source_fields: Sequence[str]) -> str:
    for name in source_fields:
        value = _lookup(record, name)
        if isinstance(value, str) and value:
            return value
    return UNKNOWN_SOURCE


# ------------------------------------------------------------------------------------------ split + order
def split_of(doc_id: int, val_fraction: float, test_fraction: float) -> int:
    """0 = train, 1 = val, 2 = test; a function of the document alone, so no document is in two splits."""
    u = hash64(SPLIT_ORDER_KEY, b"split", doc_id.to_bytes(8, "little")) / 2.0 ** 64
    if u < val_fraction:
        return 1
    if u < val_fraction + test_fraction:
        return 2
    return 0


# Which split an input file's documents go to: HASHED files (the train inputs) are split by document hash with
# the configured fractions; a --val-input / --test-input file goes wholly to that split.
HASHED = -1
_EVAL_NAME = re.compile(r"(?:^|[^a-z])(val|valid|validation|dev|test)(?:[^a-z]|$)")


def assign_split(doc_id: int, input_split: int, val_fraction: float, test_fraction: float) -> int:
    """The split of one copy of a document: its input file's split, or the document hash's for train inputs."""
    if input_split == HASHED:
        return split_of(doc_id, val_fraction, test_fraction)
    return input_split


def split_wins(split: int, other: int) -> bool:
    """When copies of one document sit in different splits, the held-out one is kept: test over val over
    train (official Pile val/test stay whole, and no text is ever in two splits)."""
    return split > other


def looks_like_held_out(path: str) -> bool:
    """A train input whose file name says val/valid/test/dev (e.g. the Pile's `val.jsonl.zst`): worth a warning."""
    name = path.rstrip("/").rsplit("/", 1)[-1].lower()
    return _EVAL_NAME.search(name) is not None


SPLIT_SHIFT = 62  # a sort key holds the split in its top 2 bits and a seeded order key below


def sort_key(doc_id: int, split: int, seed: int) -> int:
    """Seeded position of a document in its split: shards are contiguous ranges of this key."""
    order = hash64(SPLIT_ORDER_KEY, b"order", seed.to_bytes(8, "little", signed=True),
                   doc_id.to_bytes(8, "little"))
    return (split << SPLIT_SHIFT) | (order >> 2)


def shard_key_range(split: int, shard: int, num_shards: int) -> tuple[int, int]:
    """[lo, hi) of sort keys that belong to shard `shard` of `num_shards` in `split`."""
    span = 1 << SPLIT_SHIFT
    base = split << SPLIT_SHIFT
    return base + span * shard // num_shards, base + span * (shard + 1) // num_shards
