"""Rust panics (pyo3's PanicException, a BaseException) of the tokenizers' libraries: at load a one-line
TokenizerError, per document a `tokenizer_panic` Rejected that the job dead-letters; nothing else swallowed."""
from __future__ import annotations

import pytest

from tests.unit.tokenize.crafted import added_token, as_bytes, byte_level_spec, tiktoken_bytes
from transforms.tokenize import formats, native, tokenizer
from transforms.tokenize.formats import TokenizerOptions

BACKTRACKS = r"(?:a|aa)+(?!b)c|\s|\w|[^\s\w]"  # covers text, but over the backtrack limit on a run of "a"


def _real_panic() -> BaseException:
    import tiktoken

    try:  # a repeated rank: tiktoken's Rust code panics (what tiktoken_ranks now refuses first)
        tiktoken.Encoding("p", pat_str=r"\S+|\s+", mergeable_ranks={b"a": 0, b"b": 0}, special_tokens={})
    except BaseException as e:  # noqa: BLE001
        return e
    pytest.fail("tiktoken no longer panics on a repeated rank")


def test_a_panic_is_told_apart_from_interrupts():
    panic = _real_panic()
    assert not isinstance(panic, Exception) and native.is_panic(panic)
    assert not native.is_panic(KeyboardInterrupt()) and not native.is_panic(RuntimeError("x"))
    with pytest.raises(formats.FormatError, match="tiktoken panicked loading this file"):
        with native.load_guard("tiktoken"):
            raise panic
    with pytest.raises(KeyboardInterrupt):
        with native.load_guard("tiktoken"):
            raise KeyboardInterrupt


def test_a_document_that_panics_tiktoken_is_rejected_and_the_others_are_encoded():
    ref = tokenizer.load_processor(tiktoken_bytes(), "x", TokenizerOptions(pattern=BACKTRACKS,
                                                                            special_tokens="<|endoftext|>=300"))
    out = tokenizer.encode_batch(ref, ["hello", "a" * 60, "x y"])
    assert out[0].tolist() == list(b"hello") and out[2].tolist() == list(b"x y")
    assert out[1].reason == native.TOKENIZER_PANIC and "BacktrackLimitExceeded" in out[1].detail


def test_a_document_that_panics_hf_split_regex_is_rejected():
    spec = byte_level_spec(added=[added_token(256, "<|endoftext|>")])
    spec["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": BACKTRACKS}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    ref = tokenizer.load_processor(as_bytes(spec), "x")
    out = tokenizer.encode_batch(ref, ["a" * 5000, "hello"])
    assert isinstance(out[0], tokenizer.Rejected) and out[0].reason == native.TOKENIZER_PANIC
    assert out[1].tolist() == list(b"hello")
