"""tokenizer.json files the second hostile review (rv2) found accepted: refused when loaded (TokenizerError: exit 2,
one line naming the entry) before any worker or library sees them. F1: a vocab id past a gap; F3: a normalizer
that only deletes text (Replace with empty content, Strip), anywhere in a Sequence; F4: add_prefix_space beside
non-special added tokens; F8: a spec nested past Python's recursion limit. What stays accepted is checked too."""
from __future__ import annotations

import json

import pytest

from tests.unit.tokenize.crafted import added_token, as_bytes, byte_level_spec, tiktoken_bytes
from transforms.tokenize import file_checks, formats, tokenizer
from transforms.tokenize.formats import TokenizerOptions

EOT = added_token(257, "<|endoftext|>")
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
PREFIX_SPACE = {**BYTE_LEVEL, "add_prefix_space": True}


def _spec(**fields) -> dict:
    spec = byte_level_spec([("h", "e")], added=[EOT])
    spec.update(fields)
    return spec


def _refused(data: bytes, match: str):
    with pytest.raises(tokenizer.TokenizerError, match=match) as info:
        tokenizer.load_processor(data, "crafted.json")
    assert "\n" not in str(info.value)


def test_a_vocab_id_past_a_gap_is_refused_naming_it():
    spec = _spec()
    spec["model"]["vocab"]["zz"] = 100_000  # a hole at 258..99999: the count (259) picks a uint16 spill
    _refused(as_bytes(spec), r"vocab entry 'zz' has id 100000, but no vocab entry or added token has id 258")
    spec = byte_level_spec([("h", "e")], added=[added_token(258, "<|endoftext|>")], vocab={"zz": 257})  # no gap
    assert tokenizer.load_processor(as_bytes(spec), "no-gap.json").decode([257]) == "zz"


def test_a_contiguous_vocab_loads_and_a_tiktoken_rank_gap_still_runs():
    ref = tokenizer.load_processor(as_bytes(_spec()), "ok.json")
    assert ref.encode("hehe") == [256, 256]
    data = tiktoken_bytes(extra=[(b"he", 100_000)])  # a rank gap: tiktoken numbers by rank (reviewed: rc 0)
    tt = tokenizer.load_processor(data, "gap.tiktoken",
                                  TokenizerOptions(pattern="gpt2", special_tokens="<|endoftext|>=100001"))
    assert tt.encode("he") == [100_000]


DELETING = [
    ({"type": "Replace", "pattern": {"String": "e"}, "content": ""}, r"normalizer is a Replace normalizer that "
                                                                     r"replaces \{\"String\": \"e\"\} with nothing"),
    ({"type": "Strip", "strip_left": True, "strip_right": False}, "normalizer is a Strip normalizer that strips"),
    ({"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Strip", "strip_left": True,
                                                           "strip_right": True}]},
     r"normalizer\.normalizers\[1\] is a Strip normalizer"),
]


@pytest.mark.parametrize("normalizer, match", DELETING, ids=["replace-empty", "strip", "strip-in-sequence"])
def test_a_normalizer_that_only_deletes_text_is_refused(normalizer, match):
    _refused(as_bytes(_spec(normalizer=normalizer)), match)


@pytest.mark.parametrize("normalizer", [{"type": "Lowercase"},
                                        {"type": "Replace", "pattern": {"String": "e"}, "content": "E"},
                                        {"type": "Strip", "strip_left": False, "strip_right": False}])
def test_a_normalizer_that_rewrites_text_is_accepted(normalizer):
    file_checks.check_hf(_spec(normalizer=normalizer))
    assert tokenizer.load_processor(as_bytes(_spec(normalizer=normalizer)), "n.json")


def test_add_prefix_space_is_refused_beside_non_special_added_tokens_only():
    tabs = added_token(258, "\t\t", special=False)
    _refused(as_bytes(_spec(pre_tokenizer=PREFIX_SPACE, decoder=PREFIX_SPACE, added_tokens=[EOT, tabs])),
             r"add_prefix_space = true and 1 non-special added token\(s\) \(\"\\t\\t\", ...\)")
    ref = tokenizer.load_processor(as_bytes(_spec(pre_tokenizer=PREFIX_SPACE, decoder=PREFIX_SPACE)), "p.json")
    assert ref.decode(ref.encode("he\t\the")) == " he\t\the"  # the one documented leading space


def _nested(depth: int) -> dict:
    node = dict(BYTE_LEVEL)
    for _ in range(depth):
        node = {"type": "Sequence", "pretokenizers": [node]}
    return node


def test_a_spec_nested_past_the_recursion_limit_is_a_format_error():
    deep = '{"type": "Sequence", "pretokenizers": [' * 3000 + json.dumps(BYTE_LEVEL) + "]}" * 3000
    data = as_bytes(_spec()).replace(b'"pre_tokenizer": {', b'"pre_tokenizer": ' + deep.encode() + b', "x": {', 1)
    with pytest.raises(formats.FormatError, match="nested too deeply"):
        formats.detect(data)
    _refused(data, "nested too deeply")
    # parsed (built in Python) but too deep for the checks' walks: the same one line
    with pytest.raises(formats.FormatError, match="nested too deeply"):
        file_checks.check_hf(_spec(pre_tokenizer=_nested(5000)))
