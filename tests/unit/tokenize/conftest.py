"""Fixtures of the tokenizer tests: an HF byte-level BPE and its tiktoken file, trained here."""
from __future__ import annotations

import pytest

from pipeline.tools.sample_corpus import write_sample_corpus
from pipeline.tools.tokenizer_train import train_hf_bpe


@pytest.fixture(scope="session")
def hf_bpe(tmp_path_factory):
    """A byte-level BPE tokenizer.json (GPT-NeoX settings) and its tiktoken file, trained here."""
    corpus = tmp_path_factory.mktemp("corpus")
    write_sample_corpus(str(corpus), target_mb=1)
    out = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    summary = train_hf_bpe([f"{corpus}/train/*.jsonl.zst"], str(out), 700, max_sentences=600,
                           max_sentence_chars=1024)
    return out, summary


@pytest.fixture(autouse=True)
def _tokenizer_cache(tmp_path_factory, monkeypatch):
    """The converted-tokenizer cache (transforms/tokenize/tokenizer_backends.py) in a folder of this session, not
    the user's ~/.cache."""
    monkeypatch.setenv("PILEPREP_TOKENIZER_CACHE", str(tmp_path_factory.getbasetemp() / "tokenizer-cache"))
