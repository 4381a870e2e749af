"""`verify --inputs` as the second hostile review (rv2) found it: F4, a ByteLevel add_prefix_space tokenizer's one
leading space failed every document's round trip; F5, an input was matched by the literal path string typed at
shard time, and a relative manifest tokenizer path was reported as "--tokenizer" (pipeline/tools/verify_inputs.py
RoundTrip and held_inputs; F5's message: tests/unit/tools/test_verify_audit.py)."""
from __future__ import annotations

import hashlib

from model_contract.manifest_rows import LedgerRow
from pipeline.tools import verify_inputs
from tests.unit.tokenize.crafted import added_token, as_bytes, byte_level_spec
from transforms.tokenize import tokenizer

PREFIX_SPACE = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}


def test_a_prefix_space_tokenizer_round_trips_with_exactly_its_one_leading_space():
    data = as_bytes({**byte_level_spec([("h", "e")], added=[added_token(257, "<|endoftext|>")]),
                     "pre_tokenizer": PREFIX_SPACE, "decoder": PREFIX_SPACE})
    ref = tokenizer.load_processor(data, "prefix.json")
    trip = verify_inputs.round_trip(ref, data)
    assert trip.prefix_space and trip.note == ""
    for text in ("hello world", " already spaced", "\nnewline first", ""):
        assert trip.matches(ref.decode(ref.encode(text)), text), text
    assert not trip.matches("  hello", "hello")  # two spaces: not the documented form
    assert not trip.matches(" hello", " hello ") and not trip.matches("  x", " x")
    plain = verify_inputs.RoundTrip(ref.decode)
    assert not plain.matches(" hello", "hello")  # without add_prefix_space the space is a difference


class _Manifest:
    def __init__(self, inputs, ledger):
        self.inputs = [{"path": p} for p in inputs]
        self.ledger = [LedgerRow(path=p, bytes=None, generation="gen-0123456789abcdef", sha256=s) for p, s in ledger]


def test_inputs_match_by_name_resolved_path_or_content_and_nothing_else(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    a1, b1, other = tmp_path / "a" / "c1.jsonl", tmp_path / "b1.jsonl", tmp_path / "other.jsonl"
    a1.write_bytes(b'{"text": "one"}\n')
    b1.write_bytes(b'{"text": "two"}\n')
    other.write_bytes(b'{"text": "three"}\n')
    sha = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (a1, b1)}
    # a1 recorded absolute, b1 recorded relative to a directory the manifest does not name
    manifest = _Manifest([str(a1), "b1.jsonl"], [(str(a1), sha[a1]), ("b1.jsonl", sha[b1])])
    monkeypatch.chdir(tmp_path / "a")
    names, problems = verify_inputs.held_inputs(manifest, ["c1.jsonl", "./c1.jsonl", "../b1.jsonl", str(other)])
    assert names == {"c1.jsonl": str(a1), "./c1.jsonl": str(a1), "../b1.jsonl": "b1.jsonl"}, names
    assert problems == []
    assert str(other) not in names  # neither its name, its resolved path nor its content is an input's
    # two inputs with one content: ambiguous, said so
    twin = _Manifest(["x.jsonl", "y.jsonl"], [("x.jsonl", sha[a1]), ("y.jsonl", sha[a1])])
    names, problems = verify_inputs.held_inputs(twin, [str(a1)])
    assert names == {} and len(problems) == 1 and "several inputs" in problems[0], problems
