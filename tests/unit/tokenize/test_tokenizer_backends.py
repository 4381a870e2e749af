"""The exact fast tokenizer paths (gigatoken, splintr, kitoken) on SentencePiece models: used only where they give
SentencePiece's ids."""
from __future__ import annotations

import hashlib
import json

import pytest
import sentencepiece as spm

from tests.conftest import shared_data, stdlib_texts
from transforms.tokenize import fast_encoders, tokenizer_cache
from transforms.tokenize import tokenizer_backends as tb

LLAMA2 = ("tokenizers", "llama2-bpe-32k.model")


def _sp(path):
    return spm.SentencePieceProcessor(model_file=str(path))


def _real_texts() -> list:
    texts = []
    for name in ("arxiv.jsonl", "enron_examples.jsonl"):
        texts += [json.loads(line)["text"] for line in shared_data("other", name).read_text().splitlines()
                  if line.strip()]
    import zstandard

    raw = zstandard.ZstdDecompressor().stream_reader(
        shared_data("other", "lm_dataformat-naughty-strings.jsonl.zst").open("rb"), read_across_frames=True).read()
    texts += [json.loads(line)["text"] for line in raw.splitlines() if line.strip()]
    texts += [line for t in texts[-4:] if isinstance(t, str) for line in t.splitlines()]  # each naughty string alone
    # text that looks like special pieces must stay plain characters, as in sp.encode
    texts += ["<s>hello</s> <unk> <pad> [INST] x", "\u200b\ufeff\U0001f600 ünïcödé\r\n\t"]
    return [t for t in texts if isinstance(t, str)]  # the job dead-letters non-string text before tokenizing


def test_model_type_read_from_the_proto(tiny_tokenizer):
    assert tb.model_type(shared_data(*LLAMA2).read_bytes()) == "bpe"
    assert tb.model_type(open(tiny_tokenizer, "rb").read()) == "bpe"
    assert tb.model_type(shared_data("tokenizers", "unigram-1k-test.model").read_bytes()) == "unigram"


def test_kitoken_matches_sentencepiece_on_real_and_naughty_text():
    model = shared_data(*LLAMA2)
    sp = _sp(model)
    texts = _real_texts() + [t for _, t in stdlib_texts(400_000)]
    report = tb.compare(sp, tb.KitokenEncoder(model.read_bytes(), sp, spot_check_every=0), texts)
    assert report.documents == len(texts) and report.exact, report.mismatches


@pytest.mark.parametrize("model", ["llama2", "tiny"])
def test_splintr_matches_sentencepiece_on_real_and_naughty_text(model, tiny_tokenizer):
    path = shared_data(*LLAMA2) if model == "llama2" else tiny_tokenizer
    sp = _sp(path)
    model_bytes = open(path, "rb").read()
    texts = _real_texts() + [t for _, t in stdlib_texts(400_000)] + tb.parity_texts(model_bytes)
    report = tb.compare(sp, tb.SplintrEncoder(model_bytes, sp, spot_check_every=0), texts)
    assert report.documents == len(texts) and report.exact, report.mismatches


def test_splintr_matches_sentencepiece_on_every_piece_and_repeated_runs():
    """Where an HF-style BPE could part from SentencePiece's: a text that is exactly one vocabulary piece (splintr
    emits a whole-chunk vocabulary hit without merging), ties in score (whitespace-only pieces; two splits of one
    piece) inside runs of a repeated unit, and the empty text."""
    model = shared_data(*LLAMA2)
    sp = _sp(model)
    pieces = [p.replace("\u2581", " ") for p, _s, kind in tb.model_pieces(model.read_bytes()) if kind == 1]
    texts = [t for p in pieces for t in (p, p.lstrip(" "), f"({p})")]
    units = [" ", "  ", "\t", "\n", "a", "aa", "ab", "=", "-", "0", "\u2581", "é", "日", "\U0001f600", "<s>", " x"]
    texts += [u * k + tail for u in units for k in range(1, 34) for tail in ("", "x", " x", "\n")]
    texts += ["", "\n" + " " * 12 + "return x", "\x00\x01\x1b[31m\x7f", "a\u00a0b\u3000c", "\r\n\r\n", "\ufb01 \u2460"]
    report = tb.compare(sp, tb.SplintrEncoder(model.read_bytes(), sp, spot_check_every=0), texts)
    assert report.documents == len(texts) and report.exact, [texts[i] for i in report.mismatches[:10]]


@pytest.mark.parametrize("encoder_class", [tb.SplintrEncoder, tb.GigatokenEncoder])
def test_one_encoder_from_two_threads_gives_sentencepiece_ids(encoder_class):
    """Beam's multi_threading mode shares a process: splintr's call releases the GIL, and gigatoken's tokenizer is
    one per model and process (`_gigatoken_tokenizer`): while a fresh one's first `encode` runs, a second thread's
    calls failed with "Already borrowed" before the encoder's lock (a narrow window: this test caught it in 2 of
    ~20 runs without the lock, docs/BENCHMARKS.md has the direct measurement). Both stay exact, spot checks
    included."""
    import threading

    model = shared_data(*LLAMA2)
    sp = _sp(model)
    tb._gigatoken_tokenizer.cache_clear()  # a fresh tokenizer, first used by the two threads at once
    encoder = encoder_class(model.read_bytes(), sp, spot_check_every=1)
    texts = [f"x{i} = f({i})" for i in range(2000)] + [t for _, t in stdlib_texts(600_000)]
    got: dict = {}

    def work(part):  # one call with the thread's list, as tokenize_chunk calls it: encodes back to back
        mine = list(range(part, len(texts), 2))
        for i, ids in zip(mine, encoder.encode([texts[i] for i in mine])):
            got[i] = ids.tolist()
    threads = [threading.Thread(target=work, args=(part,)) for part in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got.get(i) for i in range(len(texts))] == sp.encode(texts, out_type=int)
    assert encoder.spot_checked > 0  # every document was also checked against SentencePiece, on its thread


def test_the_converted_tokenizer_json_is_cached_between_processes(tmp_path, monkeypatch):
    """gigatoken's tokenizer.json for a `.model` is written once (atomically) under a key of the model's sha256, format
    and gigatoken's version, then read instead of converting again; a cache that is off or unwritable only costs
    the conversion."""
    import os

    model_bytes = shared_data(*LLAMA2).read_bytes()
    fresh = tb.gigatoken_tokenizer_json(model_bytes, "sentencepiece")
    monkeypatch.setenv(tb.TOKENIZER_CACHE_ENV, str(tmp_path / "cache"))
    assert tb.cached_gigatoken_tokenizer_json(model_bytes, "sentencepiece") == fresh
    [name] = os.listdir(tmp_path / "cache")  # no temporary file left beside it
    # named by the digest of its key (the model's sha256, format, gigatoken's version), which its header repeats
    key = tb.gigatoken_json_key(model_bytes, "sentencepiece")
    assert key["source_sha256"] == hashlib.sha256(model_bytes).hexdigest()
    assert name == f"gigatoken-json-{tokenizer_cache.key_digest(key)}.bin"

    def no_conversion(*_args):
        raise AssertionError("converted again")
    monkeypatch.setattr(fast_encoders, "gigatoken_tokenizer_json", no_conversion)
    assert tb.cached_gigatoken_tokenizer_json(model_bytes, "sentencepiece") == fresh  # read back, not converted
    monkeypatch.undo()
    monkeypatch.setattr(fast_encoders, "gigatoken_tokenizer_json", lambda *_a: "converted")
    for setting in ("off", str(tmp_path / "a-file" / "cache")):
        (tmp_path / "a-file").write_text("")  # a cache folder that cannot be created
        monkeypatch.setenv(tb.TOKENIZER_CACHE_ENV, setting)
        assert tb.cached_gigatoken_tokenizer_json(model_bytes, "sentencepiece") == "converted"
    sp = _sp(shared_data(*LLAMA2))  # the encoder built from the cached text is the one parity-checked
    monkeypatch.undo()
    monkeypatch.setenv(tb.TOKENIZER_CACHE_ENV, str(tmp_path / "cache"))
    tb._gigatoken_tokenizer.cache_clear()
    encoder = tb.GigatokenEncoder(model_bytes, sp, spot_check_every=1)
    texts = _real_texts()
    assert [ids.tolist() for ids in encoder.encode(texts)] == sp.encode(texts, out_type=int)


def _with_normalizer_flag(model_bytes: bytes, field: int, value: int) -> bytes:
    """The model with one NormalizerSpec flag overridden: a second ModelProto field 3 merges into the first, as
    protobuf defines it, so SentencePiece itself loads and applies the changed flag."""
    inner = bytes([field << 3, value])
    return model_bytes + bytes([3 << 3 | 2, len(inner)]) + inner


def test_splintr_refuses_a_model_whose_encode_it_does_not_reproduce():
    """remove_extra_whitespaces=true (SentencePiece's default) collapses "a  b"; splintr has no such step."""
    llama = shared_data(*LLAMA2).read_bytes()
    squeezing = _with_normalizer_flag(llama, 4, 1)
    sp = spm.SentencePieceProcessor(model_proto=squeezing)
    assert sp.encode("a  b") != _sp(shared_data(*LLAMA2)).encode("a  b")  # the flag is real: the ids differ
    assert tb.splintr_unsupported(llama) == ""
    assert {"<s>", "</s>", "<unk>", "<0x0A>", "x<s> <s>y\n"} <= set(tb.parity_texts(llama))  # checked every run
    assert "remove_extra_whitespaces" in tb.splintr_unsupported(squeezing)
    choice = tb.choose_backend("splintr", squeezing, sp, ["a  b", "x"])
    assert choice.name == "sentencepiece" and "remove_extra_whitespaces" in choice.reason
    uni = shared_data("tokenizers", "unigram-1k-test.model").read_bytes()
    assert "normalizer" in tb.splintr_unsupported(uni)
    with pytest.raises(ValueError, match="normalizer"):
        tb.SplintrEncoder(uni, _sp(shared_data("tokenizers", "unigram-1k-test.model")))


def test_auto_considers_gigatoken_only_and_records_the_fallback(monkeypatch):
    """kitoken breaks SentencePiece's score ties by id (tests/fixtures/sp_models.py) and splintr's exactness is
    shown only on the models tested: neither is proven by the exact domain, so `auto` never picks them; they
    stay selectable by name."""
    model = shared_data(*LLAMA2)
    sp = _sp(model)
    texts = _real_texts()[-60:]  # the short ones: each naughty string alone
    assert tb.FAST_BACKENDS["sentencepiece"] == ("gigatoken",) == tb.FAST_BACKENDS["hf-tokenizer-json"]
    choice = tb.choose_backend("auto", model.read_bytes(), sp, texts)
    assert choice.name == "gigatoken" and choice.reason == "parity with sentencepiece on the run's sample"
    assert choice.version and choice.parity_documents == len(texts) and choice.parity_tokens > 0
    assert choice.spot_check_every == 1024  # ~32x sp.encode: 1 in 1024 keeps the re-encode under 5%
    for name in ("gigatoken", "splintr", "kitoken"):
        assert tb.choose_backend(name, model.read_bytes(), sp, texts).name == name
    # gigatoken not installed: auto falls back to the reference, not to splintr or kitoken, and says why
    monkeypatch.setitem(tb._ENCODERS, "gigatoken", (tb._ENCODERS["gigatoken"][0], "gigatoken-not-installed"))
    choice = tb.choose_backend("auto", model.read_bytes(), sp, texts)
    assert choice.name == "sentencepiece" and "gigatoken: not installed" in choice.reason
    assert "splintr" not in choice.reason and "kitoken" not in choice.reason


def test_auto_chooses_a_fast_backend_on_bpe_after_parity_and_sentencepiece_on_unigram():
    model = shared_data(*LLAMA2)
    sp = _sp(model)
    choice = tb.choose_backend("auto", model.read_bytes(), sp, _real_texts())
    assert choice.name == "gigatoken" and choice.parity_documents == len(_real_texts()) and choice.parity_tokens > 0
    uni = shared_data("tokenizers", "unigram-1k-test.model")
    for backend in ("gigatoken", "kitoken", "splintr", "auto"):
        fallback = tb.choose_backend(backend, uni.read_bytes(), _sp(uni), _real_texts())
        assert fallback.name == "sentencepiece" and "unigram" in fallback.reason
    assert tb.choose_backend("sentencepiece", model.read_bytes(), sp, []).name == "sentencepiece"


def test_parity_failure_falls_back_and_spot_check_mismatch_fails(tiny_tokenizer):
    """A fast encoder over one model checked against SentencePiece over another: real disagreement."""
    llama = shared_data(*LLAMA2)
    other_sp = _sp(tiny_tokenizer)
    choice = tb.choose_backend("auto", llama.read_bytes(), other_sp, ["def f(x):\n    return x\n"])
    assert choice.name == "sentencepiece" and "differ" in choice.reason
    for name, encoder_class in (("kitoken", tb.KitokenEncoder), ("splintr", tb.SplintrEncoder),
                                ("gigatoken", tb.GigatokenEncoder)):
        choice = tb.choose_backend(name, llama.read_bytes(), other_sp, ["def f(x):\n    return x\n"])
        assert choice.name == "sentencepiece" and "differ" in choice.reason and name in choice.reason
        encoder = encoder_class(llama.read_bytes(), other_sp, spot_check_every=1)
        with pytest.raises(tb.BackendMismatchError, match=f"{name} and sentencepiece.*--tokenizer-backend reference"):
            encoder.encode(["import os\n"])
