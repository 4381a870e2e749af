"""Tokenizer training: byte fallback, special ids, exact round-trip on code, determinism, clear errors."""
import hashlib
import inspect
import json

import pytest
import sentencepiece as spm

from pipeline.tools.sample_corpus import write_sample_corpus
from pipeline.tools.tokenizer_train import BOS_ID, EOS_ID, PAD_ID, UNK_ID, train_tokenizer

VOCAB = 1000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok-corpus")
    write_sample_corpus(str(out), target_mb=1)
    return str(out)


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tok") / "sub" / "m.model")
    summary = train_tokenizer([f"{corpus}/train/*.jsonl.zst"], path, VOCAB, max_sentences=400)
    return path, summary


def _load(path):
    return spm.SentencePieceProcessor(model_file=path)


def test_summary_and_special_ids(trained):
    path, summary = trained
    sp = _load(path)
    assert sp.get_piece_size() == VOCAB == summary["vocab_size"]
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert summary["sentences"] <= 400 and summary["files"] == 8 and summary["documents"] > 0
    assert summary["model_sha256"] == hashlib.sha256(open(path, "rb").read()).hexdigest()
    json.dumps(summary)  # the CLI prints it


def test_byte_fallback_has_no_unk(trained):
    sp = _load(trained[0])
    for text in ["emoji 😀 here", "rare CJK 𠜎 龘", "\x00\x7f\u200b", "é\r\n\t"]:
        ids = sp.encode(text)
        assert sp.unk_id() not in ids, text
        assert sp.decode(ids) == text


def test_round_trip_on_stdlib_code(trained):
    sp = _load(trained[0])
    text = inspect.getsource(json.decoder)
    assert sp.decode(sp.encode(text)) == text
    for text in ["  two leading spaces", "trailing  \n\n", "\tx = 1  # 1234567890\n", "a\n\n\n   b"]:
        assert sp.decode(sp.encode(text)) == text


def test_deterministic(corpus, trained, tmp_path):
    path, summary = trained
    again = train_tokenizer([f"{corpus}/train/*.jsonl.zst"], str(tmp_path / "again.model"), VOCAB, max_sentences=400)
    assert again["model_sha256"] == summary["model_sha256"]
    assert open(path, "rb").read() == open(tmp_path / "again.model", "rb").read()


def test_glob_order_does_not_matter(corpus, trained, tmp_path):
    globs = [f"{corpus}/train/0[4-7].jsonl.zst", f"{corpus}/train/0[0-3].jsonl.zst"]
    again = train_tokenizer(globs, str(tmp_path / "o.model"), VOCAB, max_sentences=400)
    assert again["model_sha256"] == trained[1]["model_sha256"]


def test_missing_glob_is_named(corpus, tmp_path):
    missing = str(tmp_path / "nothing" / "*.jsonl.zst")
    with pytest.raises(ValueError, match="matched no files") as err:
        train_tokenizer([f"{corpus}/val.jsonl.zst", missing], str(tmp_path / "m.model"), VOCAB)
    assert missing in str(err.value)


def test_vocab_size_errors(corpus, tmp_path):
    with pytest.raises(ValueError, match="too small"):
        train_tokenizer([f"{corpus}/val.jsonl.zst"], str(tmp_path / "m.model"), 100)
    with pytest.raises(ValueError, match="vocab-size 500000 is too large"):
        train_tokenizer([f"{corpus}/val.jsonl.zst"], str(tmp_path / "m.model"), 500_000)
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_damaged_input_is_counted_not_fatal(corpus, tmp_path):
    good = open(f"{corpus}/val.jsonl.zst", "rb").read()
    (tmp_path / "cut.jsonl.zst").write_bytes(good[: len(good) // 2])
    (tmp_path / "bad.jsonl").write_text('{"text": "x = 1\\n", "meta": {"pile_set_name": "S"}}\nnot json\n')
    summary = train_tokenizer([str(tmp_path / "*.jsonl*"), f"{corpus}/val.jsonl.zst"],
                              str(tmp_path / "out" / "m.model"), 400)
    assert summary["rejected"].get("invalid_json") == 1
    assert summary["rejected"].get("zstd_truncated") == 1
