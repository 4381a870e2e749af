"""Issue 10.2: the exact fast tokenizer path (kitoken) — used only where it gives SentencePiece's ids."""
from __future__ import annotations

import json

import pytest
import sentencepiece as spm

from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from tests.conftest import shared_data, stdlib_texts
from tests.corpus_fixtures import write_good_corpus
from tests.ops_fixtures import FAST_LOCAL, dataset_files
from transforms import tokenizer_backends as tb

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


def test_auto_chooses_kitoken_on_bpe_after_parity_and_sentencepiece_on_unigram():
    model = shared_data(*LLAMA2)
    sp = _sp(model)
    choice = tb.choose_backend("auto", model.read_bytes(), sp, _real_texts())
    assert choice.name == "kitoken" and choice.parity_documents == len(_real_texts()) and choice.parity_tokens > 0
    uni = shared_data("tokenizers", "unigram-1k-test.model")
    fallback = tb.choose_backend("kitoken", uni.read_bytes(), _sp(uni), _real_texts())
    assert fallback.name == "sentencepiece" and "unigram" in fallback.reason
    assert tb.choose_backend("sentencepiece", model.read_bytes(), sp, []).name == "sentencepiece"


def test_parity_failure_falls_back_and_spot_check_mismatch_fails(tiny_tokenizer):
    """A kitoken encoder over one model checked against SentencePiece over another: real disagreement."""
    llama = shared_data(*LLAMA2)
    other_sp = _sp(tiny_tokenizer)
    choice = tb.choose_backend("auto", llama.read_bytes(), other_sp, ["def f(x):\n    return x\n"])
    assert choice.name == "sentencepiece" and "differs" in choice.reason
    encoder = tb.KitokenEncoder(llama.read_bytes(), other_sp, spot_check_every=1)
    with pytest.raises(tb.BackendMismatchError, match="--tokenizer-backend sentencepiece"):
        encoder.encode(["import os\n"])


def test_shards_are_byte_identical_across_backends(tmp_path):
    """Only the manifest's record of which backend ran may differ."""
    tokenizer = str(shared_data(*LLAMA2))
    write_good_corpus(tmp_path / "in", limit_bytes=400_000, files=2)
    outs = {}
    for backend in ("sentencepiece", "auto"):
        cfg = ShardConfig(inputs=(str(tmp_path / "in" / "*"),), output=str(tmp_path / backend), tokenizer=tokenizer,
                          seq_len=256, num_shards=2, tokenizer_backend=backend)
        shard_pipeline.run(cfg, FAST_LOCAL, progress_every_s=0)
        outs[backend] = dataset_files(tmp_path / backend)
    a, b = outs["sentencepiece"], outs["auto"]
    assert a.keys() == b.keys()
    assert [k for k in a if k != "manifest.json" and a[k] != b[k]] == []
    ma, mb = json.loads(a["manifest.json"]), json.loads(b["manifest.json"])
    assert ma.pop("tokenizer_backend")["name"] == "sentencepiece"
    assert mb.pop("tokenizer_backend")["name"] == "kitoken"
    assert ma == mb
