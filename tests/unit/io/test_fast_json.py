"""The fast JSON path (transforms/io/fast_json.py) gives every record the strict parser's outcome: the same
Document, or the same filtered / dead-letter reason and excerpt, on the named hostile records and on the whole
seeded fuzz corpus of test_fuzz_inputs.py; and it is really taken for ordinary records."""
from __future__ import annotations

import io
import random

import pytest

from tests.corpus_fixtures import good_documents, pile_line
from tests.unit.io.test_fuzz_inputs import encode_file, mutate, seed_lines
from transforms.io import fast_json
from transforms.io.fast_json import UNPROVEN, loads_proven
from transforms.io.read_records import RawRecord, iter_raw_records
from transforms.shard.documents import Document, loads_strict, parse_record


def outcomes(lines, monkeypatch) -> tuple[list, list]:
    """parse_record's results with the fast path, then with the strict parser alone (simdjson absent)."""
    fast = [parse_record(line) for line in lines]
    with monkeypatch.context() as m:
        m.setattr(fast_json, "simdjson", None)
        strict = [parse_record(line) for line in lines]
    return fast, strict


HOSTILE = [
    b'{"text": "a", "text": "b"}',
    b'{"text": "a", "meta": {"pile_set_name": "A", "pile_set_name": "B"}}',
    b'{"text": "x:y", "text": "z"}',  # colons inside strings around a duplicate
    b'{"text": "a", "\\u0074ext": "b"}',  # a duplicate spelled with an escape
    b'{"text": "a\\u003a", "k": 1, "k": 2}',  # an escaped colon: strict decides
    b'{"text": "a", "meta": [{"k": 1, "k": 1}]}',
    b'{"text": "a", "n": ' + b"7" * 4301 + b"}",
    b'{"text": "a", "n": ' + b"7" * 4300 + b"}",
    b'{"text": "a", "n": ' + b"7" * 400 + b"}",  # an int past the double range: simdjson refuses, strict keeps
    b'{"text": "a", "n": 123456789012345678901234567890}',  # past 64 bits: strict alone
    b'{"text": "a", "f": 1.' + b"5" * 10000 + b"}",
    b'{"text": "a", "f": 1e400}', b'{"text": "a", "f": NaN}', b'{"text": "a", "f": -Infinity}',
    b'\xef\xbb\xbf{"text": "a"}',  # a BOM: json.loads of bytes and simdjson both skip it
    '{"text": "a"}'.encode("utf-16-le"), '{"text": "a"}'.encode("utf-32"),
    b'{"text": "\\ud800"}', b'{"text": "\\udc00\\ud800"}', b'{"text": "\xed\xa0\x80"}', b'{"text": "\xff"}',
    b'{"text": "\xc0\xaf"}', b'{"text": "\\ud83d\\udca9 ok"}', b'{"text": "a\x01"}', b'{"text": "\\u0000a"}',
    b'{"text": "a"} x', b'{"text": "a"}\x0c', b'{"text": "a"} \t\r', b'{"text": "a"', b"[]", b'"s"', b"5",
    b'{"text": null}', b'{"text": 5}', b'{"text": "   "}', b'{"meta": {}}', b"  ", b"",
    *[b'{"text": "a", "m": ' + b"[" * d + b"]" * d + b"}" for d in (62, 63, 64, 65, 500, 950, 990, 1100)],
    *[b'{"text": "a", "m": ' + b'{"k":' * d + b"0" + b"}" * d + b"}" for d in (63, 64, 900, 5000)],
    b"[" * 100_000 + b"]" * 100_000,
]


def test_hostile_records_have_the_strict_outcome(monkeypatch):
    fast, strict = outcomes(HOSTILE, monkeypatch)
    for line, f, s in zip(HOSTILE, fast, strict):
        assert f == s, line[:80]


def test_duplicates_and_deep_values_are_never_proven():
    for line in (b'{"a": 1, "a": 1}', b'{"a": "x:", "a": 1}', b'{"a": {"b": 1, "b": 2}}', b'{"a": 1, "\\u0061": 1}',
                 b"[" * 65 + b"]" * 65):
        assert loads_proven(line) is UNPROVEN, line
    for line in (b'{"a": "x:y", "b": {"c": ":"}}', b"[" * 64 + b"]" * 64, b'{"a": [1, {"b": "::"}]}'):
        assert loads_proven(line) == loads_strict(line)


def test_ordinary_records_take_the_fast_path():
    lines = [pile_line(text, source).rstrip(b"\n") for text, source in good_documents(20_000, doc_chars=1500)]
    assert len(lines) > 5
    for line in lines:
        value = loads_proven(line)
        assert value is not UNPROVEN and value == loads_strict(line)


@pytest.mark.parametrize("corpus", ["sample", "shared"])
def test_the_fuzz_corpus_has_the_strict_outcome_record_by_record(corpus, monkeypatch):
    rng = random.Random(20260707)  # test_fuzz_inputs.py's seed and generator: the same files
    seeds = seed_lines(corpus)
    records, proven = [], 0
    for _file in range(300):
        lines = [mutate(rng, rng.choice(seeds)) if rng.random() < 0.8 else rng.choice(seeds)
                 for _ in range(rng.randint(1, 12))]
        plain = b"\n".join(lines) + (b"\n" if rng.random() < 0.7 else b"")
        blob, compression, _damage = encode_file(rng, plain)
        max_line = rng.choice([1 << 20, 64 << 10, 4 << 10])
        records += [i.data for i in iter_raw_records(io.BytesIO(blob), compression, max_line_bytes=max_line)
                    if isinstance(i, RawRecord)]
    fast, strict = outcomes(records, monkeypatch)
    reasons = set()
    for line, f, s in zip(records, fast, strict):
        assert f == s, line[:200]
        reasons.add("document" if isinstance(s, Document) else s.reason)
        proven += loads_proven(line) is not UNPROVEN
    assert len(records) > 1000
    assert {"document", "invalid_json", "json_too_deep", "number_too_long", "duplicate_key",
            "invalid_utf8"} <= reasons, reasons
    assert proven > len(records) // 8  # the fast path decided a good share, not only the strict one


GRAMMAR = [b"{", b"}", b"[", b"]", b'"', b":", b",", b" ", b"\t", b"\n", b"\r", b"\x0c", b"0", b"1", b"9", b"-", b"+",
           b".", b"e", b"E", b"true", b"false", b"null", b"NaN", b"Infinity", b"\x00", b"\xc3\xa9", b"\xff",
           b"\xef\xbb\xbf", b'"k"', b'"k":', b"\\", b"\\u00", b'\\"', b"\\/", b"\\ud83d", b"\\ude00", b"\x7f"]


def _same(a, b) -> bool:
    """Equal values of the same types all the way down (an int the strict parser reads is not a float)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    return a == b


def test_what_the_fast_path_proves_is_the_strict_value_on_random_grammar_pieces():
    rng = random.Random(18)
    proven = 0
    for _ in range(60_000):
        line = b"".join(rng.choice(GRAMMAR) for _ in range(rng.randint(1, 10)))
        line = b'{"t": ' + line + b"}" if rng.random() < 0.5 else line
        value = loads_proven(line)
        if value is UNPROVEN:
            continue
        proven += 1
        assert _same(value, loads_strict(line)), line  # the strict parser accepts it, with the same value
    assert proven > 500
