"""Long documents encoded in pieces give the whole document's ids, in every format; token-less runs are refused."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import zstandard

from pipeline.tools.tokenizer_train import tiktoken_path_for
from tests.conftest import shared_data, shared_data_root, stdlib_texts
from transforms.tokenize import long_documents as ld
from transforms.tokenize import tokenizer
from transforms.tokenize import tokenizer_backends as tb
from transforms.tokenize.formats import TokenizerOptions


def _shared_texts() -> list:
    """Every document of ../shared/data (Pile, C4, Dolma, arXiv, Enron, naughty strings)."""
    texts = []
    for path in sorted(shared_data_root().glob("*/*.json*")):
        raw = path.read_bytes()
        if path.name.endswith(".zst"):
            raw = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True).read()
        elif path.name.endswith(".gz"):
            raw = gzip.decompress(raw)
        for line in raw.splitlines():
            try:
                text = json.loads(line).get("text")
            except (ValueError, AttributeError):
                continue
            if isinstance(text, str) and text:
                texts.append(text)
    return texts


def _synthetic() -> list:
    code = "".join(text for _name, text in stdlib_texts(200_000))
    prose = " ".join(["The quick brown fox jumps over the lazy dog; naïve café, 東京 and ünïcödé."] * 500)
    return [code, prose, "x" * 5000 + " tail words here", "word " * 2000, " lead  and   runs\t\tof spaces  ",
            "😀 " * 800 + "end", "日本語のテキスト 中文文本 한국어 " * 300]


def _encoders(hf_bpe, tiny_tokenizer):
    path, summary = hf_bpe
    tik = TokenizerOptions(summary["tiktoken"]["pattern"], summary["tiktoken"]["special_tokens"])
    files = [(str(shared_data("tokenizers", "llama2-bpe-32k.model")), TokenizerOptions()),  # dummy prefix
             (tiny_tokenizer, TokenizerOptions()), (str(path), TokenizerOptions()),
             (tiktoken_path_for(str(path)), tik)]
    for file, options in files:
        data = tokenizer.read_model_bytes(file)
        yield file, data, tokenizer.load_processor(data, file, options)


def test_pieces_give_the_whole_documents_ids_in_every_format(hf_bpe, tiny_tokenizer):
    texts = _shared_texts() + _synthetic()
    assert len(texts) > 50
    for file, data, ref in _encoders(hf_bpe, tiny_tokenizer):
        plan = ld.plan(ref, data)
        assert plan.exact, (file, plan.reason)
        whole = ref.encode(texts, out_type=int, num_threads=2)
        bad = []
        for piece_chars in (64,):  # tiny pieces: thousands of cuts, each one a chance to differ
            for i, text in enumerate(texts):
                got = ld.encode_in_pieces(lambda p: ref.encode(p), text, plan.dummy_prefix, piece_chars, 1 << 20)
                if got.tolist() != list(whole[i]):
                    bad.append((piece_chars, i, text[:60]))
        assert bad == [], (file, bad[:5])


def test_the_fast_backend_in_pieces_and_the_jobs_encode_batch(hf_bpe, tiny_tokenizer):
    long_text = _synthetic()[0] * 3  # ~600 k characters of code
    for file, data, ref in _encoders(hf_bpe, tiny_tokenizer):
        encoder = ref
        if (("gigatoken", ref.format if hasattr(ref, "format") else "sentencepiece") in tb.SPOT_CHECK_EVERY):
            encoder = tb.GigatokenEncoder(data, ref, spot_check_every=1)  # every piece re-checked
        plan = ld.plan(encoder, data, max_pretoken_bytes=50_000, piece_chars=20_000)
        token_less = "q" * 60_000  # one stretch over --max-pretoken-mb without a boundary
        out = tokenizer.encode_batch(encoder, ["short one", long_text, token_less, "x" * 30_000], plan)
        assert out[0].tolist() == list(ref.encode("short one"))
        assert out[1].tolist() == list(ref.encode(long_text)) and out[1].dtype == np.int32
        assert out[2] == tokenizer.Rejected("pretoken_too_long")  # the caller dead-letters it
        assert out[3].tolist() == list(ref.encode("x" * 30_000))  # over a piece, under the pretoken limit


def test_cuts_are_word_starts_within_the_piece_size_and_a_long_run_is_refused():
    text = ("alpha beta, gamma 12 delta\n" * 400) + "z" * 3000 + " end"
    cuts = ld.cuts(text, 100, 5000)
    assert cuts == sorted(cuts) and all(text[c] == " " and not text[c + 1].isspace() and not text[c - 1].isspace()
                                        for c in cuts)
    bounds = [0, *cuts, len(text)]
    assert max(b - a for a, b in zip(bounds, bounds[1:])) <= 3100  # pieces stay small except the token-less run
    with pytest.raises(ld.PretokenTooLong, match="without a piece boundary"):
        ld.cuts(text, 100, 2000)
    assert ld.cuts("short", 100, 200) == []
    # the limit is in UTF-8 bytes (the encoders' memory follows them): the stretch is the space before the run
    # and 1,500 astral characters, 1,501 characters and 6,001 bytes
    astral = "alpha beta " * 20 + "\U0001F600" * 1500 + " end"
    assert ld.cuts(astral, 100, 6001)
    with pytest.raises(ld.PretokenTooLong, match="6,001 bytes"):
        ld.cuts(astral, 100, 6000)


def test_a_normalizing_model_is_encoded_whole(tiny_tokenizer):
    unigram = shared_data("tokenizers", "unigram-1k-test.model")
    data = unigram.read_bytes()
    ref = tokenizer.load_processor(data, str(unigram))
    plan = ld.plan(ref, data)
    assert not plan.exact and "normalizes" in plan.reason
    out = tokenizer.encode_batch(ref, ["word " * 300_000], ld.plan(ref, data, piece_chars=1000))
    assert out[0].tolist() == ref.encode("word " * 300_000)
