"""Tokenizer files and options that would silently lose text or have no effect are refused when loaded (exit 2,
one line naming the field): truncation, padding, pre-tokenizers that remove what they split on, a byte-level BPE
without its decoder, --tokenizer-pattern / --special-tokens given with a format that never reads them, an empty
--eos-token, and split patterns that drop characters outside the BMP (hostile review of issue 28, F2/F4/F9,
docs/wip/hostile-review-issue28.md). A lossy normalizer is accepted with one warning (transforms/tokenize/
lossy_settings.py says why)."""
from __future__ import annotations

import logging
import re

import pytest

from pipeline.config import ShardConfig
from pipeline.errors import ConfigError
from tests.unit.tokenize.crafted import added_token, as_bytes, byte_level_spec, tiktoken_bytes
from transforms.tokenize import formats, lossy_settings, tokenizer
from transforms.tokenize.formats import TokenizerOptions

EOT = added_token(257, "<|endoftext|>")  # after the 256 bytes and the one merge
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}


def _spec(**fields) -> dict:
    spec = byte_level_spec([("h", "e")], added=[EOT])
    spec.update(fields)
    return spec


def _refused(data: bytes, match: str, options: TokenizerOptions = TokenizerOptions()) -> str:
    with pytest.raises(tokenizer.TokenizerError, match=match) as info:
        tokenizer.load_processor(data, "crafted", options)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_truncation_and_padding_that_cut_or_pad_every_document_are_refused():
    truncation = {"direction": "Right", "max_length": 4, "strategy": "LongestFirst", "stride": 0}
    padding = {"strategy": {"Fixed": 64}, "direction": "Right", "pad_to_multiple_of": None, "pad_id": 0,
               "pad_type_id": 0, "pad_token": "<|endoftext|>"}
    _refused(as_bytes(_spec(truncation=truncation)), r"has truncation = \{.*max_length.*set it to null")
    _refused(as_bytes(_spec(padding=padding)), r"has padding = .*set it to null")
    # the same file with both null loads, and keeps every byte of a long text (truncation would give 4 ids)
    ref = tokenizer.load_processor(as_bytes(_spec()), "crafted")
    assert ref.decode(ref.encode("hello " * 20)) == "hello " * 20


@pytest.mark.parametrize("pre, where", [
    ({"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "Removed", "invert": False}, "pre_tokenizer"),
    ({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "Removed", "invert": False}, BYTE_LEVEL]},
     r"pre_tokenizer\.pretokenizers\[0\]"),
    ({"type": "Sequence", "pretokenizers": [{"type": "Punctuation", "behavior": "Removed"}, BYTE_LEVEL]},
     r"pre_tokenizer\.pretokenizers\[0\]"),
    ({"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, BYTE_LEVEL]}, "WhitespaceSplit"),
])
def test_a_pre_tokenizer_that_removes_what_it_splits_on_is_refused_anywhere(pre, where):
    _refused(as_bytes(_spec(pre_tokenizer=pre)),
             f"{where}.*(removing what it splits on|behavior \"Removed\").*dropped from every document")


def test_an_isolating_split_is_accepted_and_keeps_the_text():
    pre = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "Isolated", "invert": False}, BYTE_LEVEL]}
    ref = tokenizer.load_processor(as_bytes(_spec(pre_tokenizer=pre)), "crafted")
    assert ref.decode(ref.encode("a  b\n\tc")) == "a  b\n\tc"


def test_a_byte_level_bpe_without_its_decoder_is_refused():
    _refused(as_bytes(_spec(decoder=None)), "ByteLevel pre-tokenizer but decoder = null.*add a ByteLevel decoder")
    _refused(as_bytes(_spec(decoder={"type": "Fuse"})), "ByteLevel pre-tokenizer but decoder")
    wrapped = {"type": "Sequence", "decoders": [BYTE_LEVEL]}  # the decoder inside a Sequence is found
    ref = tokenizer.load_processor(as_bytes(_spec(decoder=wrapped)), "crafted")
    assert ref.decode(ref.encode("Ġ hello")) == "Ġ hello"


def test_a_lossy_normalizer_is_accepted_with_one_warning_naming_it(caplog, monkeypatch):
    monkeypatch.setattr(lossy_settings, "_warned", set())
    lower = {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]}
    data = as_bytes(_spec(normalizer=lower))
    with caplog.at_level(logging.WARNING, logger=lossy_settings.LOG.name):
        ref = tokenizer.load_processor(data, "crafted")
        tokenizer.load_processor(data, "crafted")  # a second load (another worker thread) does not repeat it
    warnings = [r.getMessage() for r in caplog.records if "normalizes text" in r.getMessage()]
    assert len(warnings) == 1 and "normalizes text (NFC, Lowercase)" in warnings[0], warnings
    assert ref.decode(ref.encode("The QUICK")) == "the quick" == ref.normalize("The QUICK")
    # Prepend is undone by the usual decoder: not lossy, no warning
    assert lossy_settings.normalizers({"normalizer": {"type": "Prepend", "prepend": "▁"}}) == ()


@pytest.mark.parametrize("pattern, dropped", [
    (r"[\x00-\uffff]+", "U+1F600"),  # the BMP only: every emoji and CJK Ext B character dropped
    ("[^\U0001F600]", "U+1F600"),  # one astral character
    ("[^\U00020000]", "U+20000"),  # CJK Extension B
    ("[^\U0010FFFF]", "U+10FFFF"),  # the last code point
    ("[^\U000E0001]|\\s", "U+E0001"),  # a format character of plane 14
    ("[^\uFFFF]", "U+FFFF"),  # the BMP's last code point (a noncharacter)
    ("[^\u0301]", "U+0301"),  # a lone combining mark
    ("[^\U0003134A]", "U+3134A"),  # no edge character: found by the sweep over every code point
])
def test_a_pattern_that_drops_a_character_anywhere_in_unicode_is_refused(pattern, dropped):
    with pytest.raises(formats.FormatError, match=rf"does not match .*\({re.escape(dropped)}\).*would drop") as info:
        formats.tiktoken_pattern(pattern)
    assert "\n" not in str(info.value)


def test_a_pattern_that_covers_every_code_point_is_accepted_by_regex_and_by_tiktoken():
    pattern = r"\p{L}+|\p{N}+|\s+|[^\p{L}\p{N}\s]+"  # custom: judged by regex (check_pattern) and tiktoken itself
    assert formats.tiktoken_pattern(pattern) == pattern
    ref = tokenizer.load_processor(tiktoken_bytes(), "crafted",
                                   TokenizerOptions(pattern=pattern, special_tokens="<|endoftext|>=300"))
    text = "emoji 😀 ext-B \U00020000 last \U0010FFFF mark \u0301 end"
    assert ref.decode(ref.encode(text)) == text


@pytest.mark.parametrize("option", [{"special_tokens": "<|x|>=5"}, {"pattern": "gpt2"}])
def test_tiktoken_only_options_are_refused_with_a_tokenizer_json_and_a_sentencepiece_model(option, tiny_tokenizer):
    flag = "--special-tokens" if "special_tokens" in option else "--tokenizer-pattern"
    with open(tiny_tokenizer, "rb") as f:
        sentencepiece_model = f.read()
    for data in (as_bytes(_spec()), sentencepiece_model):
        message = _refused(data, f"{flag} applies to tiktoken files only", TokenizerOptions(**option))
        assert "would have no effect" in message
    # with a tiktoken file both are what it needs
    assert tokenizer.load_processor(tiktoken_bytes(), "crafted",
                                    TokenizerOptions(pattern="gpt2", special_tokens="<|endoftext|>=300"))


def test_an_empty_eos_token_is_refused_and_an_absent_one_is_not():
    base = {"inputs": ("in.jsonl",), "output": "out", "tokenizer": "tok.json"}
    with pytest.raises(ConfigError, match="--eos-token is empty") as info:
        ShardConfig(**base, eos_token="").validate()
    assert "'<|endoftext|>'" in str(info.value)
    ShardConfig(**base).validate()  # not given: the tokenizer's own EOS
    ShardConfig(**base, eos_token="<|endoftext|>").validate()
    assert tokenizer.options_of(ShardConfig(**base)).eos_token == ""
    assert "eos_token" not in ShardConfig(**base).to_manifest_dict()  # not given: absent, as before
