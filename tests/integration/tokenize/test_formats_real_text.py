"""gigatoken against each format's own library on real text (standard library sources, their paragraphs and every
special token spelled as text): ~1 minute of encoding, so out of `make test-fast` (the formats' unit tests are
tests/unit/tokenize/test_formats.py)."""
from __future__ import annotations

import pytest
import sentencepiece as spm

from tests.conftest import shared_data
from tests.unit.tokenize.test_formats import _load, _texts, _with_specials
from transforms.tokenize import references, tokenizer
from transforms.tokenize import tokenizer_backends as tb


def test_gigatoken_matches_each_reference_on_real_text(hf_bpe):
    path, _summary = hf_bpe
    texts = _texts()
    data, hf = _load(path)
    assert tb.compare(hf, tb.GigatokenEncoder(data, hf), texts).exact
    import gigatoken  # the encode caches' bound is the job's, not gigatoken's 512 MiB default
    assert gigatoken.get_max_cache_bytes() == tb.GIGATOKEN_CACHE_BYTES
    llama = shared_data("tokenizers", "llama2-bpe-32k.model").read_bytes()
    sp = spm.SentencePieceProcessor(model_proto=llama)
    report = tb.compare(sp, tb.GigatokenEncoder(llama, sp), texts + _with_specials(references.special_tokens_of(sp)))
    assert report.exact, report.mismatches[:5]
    choice = tb.choose_backend("auto", data, hf, texts[:40])
    assert choice.name == "gigatoken" and choice.spot_check_every == 2048 and "tokenizers" in choice.reason
    assert tb.choose_backend("reference", data, hf, texts).name == "tokenizers"
    with pytest.raises(tokenizer.TokenizerError, match="--tokenizer-backend sentencepiece"):
        tb.choose_backend("sentencepiece", data, hf, texts)
