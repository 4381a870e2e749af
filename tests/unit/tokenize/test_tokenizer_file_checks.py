"""Tokenizer files and options refused when loaded (TokenizerError: exit 2, one line naming the entry) before their
library sees them: one id with two texts, sampling, ids past the bound, repeated tiktoken ranks, split patterns
that drop text, bad --special-tokens / --eos-token, and tokenizer paths that are not regular files."""
from __future__ import annotations

import os

import pytest

from tests.unit.tokenize.crafted import added_token, as_bytes, byte_level_spec, tiktoken_bytes
from transforms.tokenize import file_checks, tokenizer
from transforms.tokenize import tokenizer_backends as tb
from transforms.tokenize.formats import TokenizerOptions

EOT = added_token(256, "<|endoftext|>")
NEAR_2_31 = 2**31 - 5


def _refused(data: bytes, match: str, options: TokenizerOptions = TokenizerOptions()):
    with pytest.raises(tokenizer.TokenizerError, match=match) as info:
        tokenizer.load_processor(data, "crafted", options)
    assert "\n" not in str(info.value)


def _tiktoken(**kw) -> TokenizerOptions:
    return TokenizerOptions(**{"pattern": "gpt2", "special_tokens": "<|endoftext|>=300", **kw})


def test_an_added_token_on_another_texts_id_is_refused_and_the_same_text_is_not():
    _refused(as_bytes(byte_level_spec(added=[added_token(5, "hello", special=False), EOT])),
             r"added token 'hello' \(id 5\) reuses the id of vocab entry")
    _refused(as_bytes(byte_level_spec(added=[added_token(256, "<a>"), added_token(256, "<b>")])),
             "added tokens '<a>' and '<b>' share id 256")
    _refused(as_bytes(byte_level_spec(added=[EOT], vocab={"zz": 7})), "vocab entries .* share id 7")
    # an added token past a gap: HF renumbers it, gigatoken would not
    _refused(as_bytes(byte_level_spec(added=[added_token(300, "<|endoftext|>")])), "HF tokenizers reads id 256")
    # Llama: "<s>" in the vocab and as an added token on the same id; GPT-NeoX: whitespace runs added after it
    ok = byte_level_spec([("Ġ", "Ġ")], added=[added_token(257, "<s>"), added_token(258, "  ", special=False)],
                         vocab={"<s>": 257})
    ref = tokenizer.load_processor(as_bytes(ok), "crafted")
    assert ref.encode("a  b") == [97, 258, 98]
    # the same whitespace run on the vocab's `ĠĠ` id: HF numbers it anew (its text is not the vocab's)
    _refused(as_bytes(byte_level_spec([("Ġ", "Ġ")], added=[added_token(256, "  ", special=False),
                                                        added_token(257, "<|endoftext|>")])),
             "HF tokenizers reads id")
    # every added token, special or not, is spelled in the fast backends' parity texts
    texts = tb.parity_texts(as_bytes(ok), ref)
    assert "  " in texts and "<s>" in texts and "x     y\n" in texts


def test_sampling_is_refused():
    _refused(as_bytes(byte_level_spec(added=[EOT], model={"dropout": 0.1})), r"samples \(model.dropout = 0.1\)")
    assert tokenizer.load_processor(as_bytes(byte_level_spec(added=[EOT], model={"dropout": 0.0})), "x")


def test_a_subword_prefix_on_a_byte_level_bpe_is_refused_before_hf_panics():
    _refused(as_bytes(byte_level_spec([("h", "e")], added=[EOT], model={"continuing_subword_prefix": "##"})),
             "continuing_subword_prefix = '##' on a byte-level BPE")


def test_ids_past_the_bound_are_refused_before_any_library_allocates():
    assert file_checks.MAX_TOKEN_ID <= 1 << 24
    _refused(as_bytes(byte_level_spec(added=[EOT], vocab={"zz": NEAR_2_31})), f"vocab entry 'zz': id {NEAR_2_31}")
    _refused(as_bytes(byte_level_spec(added=[added_token(NEAR_2_31, "<|endoftext|>")])), "outside")
    _refused(tiktoken_bytes(extra=[(b"he", NEAR_2_31)]), "line 257 of the tiktoken file: id", _tiktoken())
    _refused(tiktoken_bytes(), "--special-tokens '<|endoftext|>': id",
             _tiktoken(special_tokens=f"<|endoftext|>={NEAR_2_31}"))
    bound = file_checks.MAX_TOKEN_ID
    _refused(tiktoken_bytes(), "outside", _tiktoken(special_tokens=f"<|endoftext|>={bound}"))
    assert tokenizer.load_processor(tiktoken_bytes(), "x", _tiktoken(special_tokens=f"<|endoftext|>={bound - 1}"))


def test_tiktoken_files_tiktoken_would_panic_on_are_refused():
    _refused(tiktoken_bytes(extra=[(b"he", 5)]), "lines 6 and 257 of the tiktoken file have the same rank 5",
             _tiktoken())
    _refused(tiktoken_bytes(extra=[(b"h", 400)]), "lines 105 and 257 of the tiktoken file hold the same token",
             _tiktoken())
    _refused(tiktoken_bytes(skip=[104]), "no token for byte 0x68", _tiktoken())


@pytest.mark.parametrize("pattern,match", [
    (r"a?|\S+|\s+", "matches the empty string"),
    (r"\p{L}+", "does not match"),  # spaces, digits, punctuation would be dropped
    (r"\p{L}+|\p{N}+|\s+|[!-~]", "does not match"),  # non-ASCII punctuation and symbols
])
def test_a_pattern_that_drops_text_is_refused(pattern, match):
    _refused(tiktoken_bytes(), match, _tiktoken(pattern=pattern))


def test_a_pattern_that_covers_text_loads_and_round_trips():
    ref = tokenizer.load_processor(tiktoken_bytes(), "x", _tiktoken(pattern=r"\p{L}+|\p{N}+|\s+|[^\s\p{L}\p{N}]+"))
    text = "Hello, wörld! 123 \u3002\u00a0\U0001F600\n"
    assert ref.decode(ref.encode(text)) == text


@pytest.mark.parametrize("special,match", [
    ("<a>=300,<b>=300", "'<a>' and '<b>' share id 300"),
    ("<a>=300,<a>=301", "'<a>' is given twice"),
    ('{"<a>": 300, "<a>": 301}', "'<a>' is given twice"),
    ('{"<a>": 300.5}', "is not an integer"),
    ('{"<a>": "300"}', "is not an integer"),
    ('{"<a>": true}', "is not an integer"),
    ("<a>=-3", "is not TEXT=ID"),
    ("<a>=3x", "is not TEXT=ID"),
    (" <a>=300", "leading or trailing whitespace"),
    ('{"<a> ": 300}', "leading or trailing whitespace"),
])
def test_bad_special_tokens_are_refused(special, match):
    _refused(tiktoken_bytes(), match, _tiktoken(special_tokens=special))


def test_an_eos_that_is_an_ordinary_piece_or_unk_is_refused(tiny_tokenizer):
    _refused(tiktoken_bytes(), "--eos-token 'a' is an ordinary token", _tiktoken(special_tokens="<a>=300,<b>=301",
                                                                                 eos_token="a"))
    _refused(tiktoken_bytes(), "leading or trailing whitespace", _tiktoken(eos_token=" <|endoftext|>"))
    _refused(as_bytes(byte_level_spec(added=[EOT])), "--eos-token 'a' is an ordinary token",
             TokenizerOptions(eos_token="a"))
    model = open(tiny_tokenizer, "rb").read()
    _refused(model, "'<unk>' is not a control piece.*unknown", TokenizerOptions(eos_token="<unk>"))
    sp = tokenizer.load_processor(model, "tiny")
    ordinary = next(sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not sp.is_control(i)
                    and not sp.is_unknown(i) and not sp.is_byte(i))
    _refused(model, "is not a control piece.*ordinary", TokenizerOptions(eos_token=ordinary))
    assert tokenizer.load_processor(model, "tiny", TokenizerOptions(eos_token="</s>")) is not None


def test_the_tokenizer_path_must_be_a_bounded_regular_file(tmp_path, monkeypatch):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, match in [("/dev/zero", "not a regular file"), (str(fifo), "not a regular file"),
                        (str(tmp_path), "a directory without a tokenizer.json"),
                        (str(tmp_path / "missing"), "cannot read the tokenizer file")]:
        with pytest.raises(tokenizer.TokenizerError, match=match):
            tokenizer.read_model_bytes(path)
    big = tmp_path / "big.json"
    big.write_bytes(b"x" * 100)
    monkeypatch.setattr(file_checks, "MAX_TOKENIZER_BYTES", 99)
    with pytest.raises(tokenizer.TokenizerError, match="100 bytes, over the 99"):
        tokenizer.read_model_bytes(str(big))
    monkeypatch.setattr(file_checks, "MAX_TOKENIZER_BYTES", 100)
    assert tokenizer.read_model_bytes(str(big)) == b"x" * 100


def test_inspect_and_the_report_read_a_manifests_tokenizer_through_the_same_opener(tmp_path):
    from pipeline.tools.report_data import contract_tokenizer

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sp, note = contract_tokenizer(str(fifo), None)  # returns at once instead of waiting for a writer
    assert sp is None and "cannot be read" in note
