"""A Rust panic while a reference library loads the file becomes the one-line TokenizerError (exit 2), for HF
`tokenizers` and tiktoken (transforms/tokenize/references.py, native.load_guard). file_checks refuses every file
known to panic first, so the libraries are made to panic here; found untested by the issue-28 mutation check
(docs/wip/mutation-issue28.md): without the guard the panic escaped as a BaseException traceback."""
from __future__ import annotations

import pytest

from tests.unit.tokenize.crafted import added_token, as_bytes, byte_level_spec, tiktoken_bytes
from tests.unit.tokenize.test_panics import _real_panic
from transforms.tokenize import tokenizer
from transforms.tokenize.formats import TokenizerOptions


def _panicking():
    """A callable that raises a real pyo3 PanicException (made before anything is patched)."""
    panic = _real_panic()

    def call(*_args, **_kwargs):
        raise panic
    return call


def test_a_panic_while_hf_tokenizers_loads_is_a_one_line_error(monkeypatch):
    import tokenizers

    class Panicking:
        from_str = staticmethod(_panicking())

    monkeypatch.setattr(tokenizers, "Tokenizer", Panicking)
    data = as_bytes(byte_level_spec(added=[added_token(256, "<|endoftext|>")]))
    with pytest.raises(tokenizer.TokenizerError, match="HF tokenizers panicked loading this file") as info:
        tokenizer.load_processor(data, "crafted")
    assert "\n" not in str(info.value)


def test_a_panic_while_tiktoken_loads_is_a_one_line_error(monkeypatch):
    import tiktoken

    monkeypatch.setattr(tiktoken, "Encoding", _panicking())
    with pytest.raises(tokenizer.TokenizerError, match="tiktoken panicked loading this file") as info:
        tokenizer.load_processor(tiktoken_bytes(), "crafted", TokenizerOptions(pattern="gpt2",
                                                                              special_tokens="<|endoftext|>=300"))
    assert "\n" not in str(info.value)
