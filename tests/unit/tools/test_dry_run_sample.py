"""pipeline/tools/dry_run_sample.py: the dry run's sample of the inputs - the whole sample's tally and each
source's (its own tokenize rate), tokenized documents counted exactly and the rest by bytes."""
from __future__ import annotations

import json

import pytest

from pipeline.config import ShardConfig
from pipeline.tools import dry_run_sample
from transforms.shard.documents import SPLITS


class _WordsAsTokens:
    """A stand-in tokenizer: one token per word (the sample only counts tokens)."""

    def encode(self, text):
        return list(range(len(text.split())))


def _write(tmp_path, docs) -> dict:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs) + "\n")
    return {"path": str(path), "bytes": path.stat().st_size}


def test_the_sample_and_each_source_tally_the_same_documents(tmp_path):
    docs = [{"text": "a b c", "meta": {"pile_set_name": "Wiki"}}, {"text": "d e", "meta": {"pile_set_name": "Git"}},
            {"text": "f g h i", "meta": {"pile_set_name": "Wiki"}}, {"text": ""}, {"no_text": 1}]
    config = ShardConfig(inputs=("x",), output="o", tokenizer="t", val_fraction=0.0, test_fraction=0.0)
    s = dry_run_sample.sample_inputs([_write(tmp_path, docs)], config, _WordsAsTokens())
    assert (s.records, s.documents, s.filtered, s.dead_letters) == (6, 3, 2, 1)  # blank last line filtered
    assert (s.tokenized_tokens, s.text_bytes, s.split_docs) == (9, 15, [3, 0, 0])
    assert set(s.by_source) == {"Wiki", "Git"}
    wiki, git = s.by_source["Wiki"], s.by_source["Git"]
    assert (wiki.documents, wiki.tokenized_tokens, wiki.tokenized_text_bytes) == (2, 7, 12)
    assert (git.documents, git.tokenized_tokens, git.split_tokens) == (1, 2, [2, 0, 0])
    assert sum(t.documents for t in s.by_source.values()) == s.documents
    assert wiki.tokens_per_byte(0.0) == pytest.approx(7 / 12)


def test_a_document_past_the_tokenize_budget_counts_by_bytes_at_the_measured_rate():
    tally = dry_run_sample.Tally()
    tally.add(0, 10, 5, cpu_s=1.0)  # tokenized: 0.5 tokens and 0.1 CPU s per byte
    tally.add(1, 4, None)  # over budget: 4 bytes of val, estimated
    assert (tally.documents, tally.text_bytes, tally.split_docs) == (2, 14, [1, 1, 0])
    assert tally.untokenized_split_bytes == [0, 4, 0] and tally.split_tokens == [5, 0, 0]
    assert tally.split_token_estimate(fallback_rate=9.0) == [5.0, 2.0, 0.0]
    assert tally.cpu_per_byte(9.0) == pytest.approx(0.1)
    assert dry_run_sample.Tally().split_token_estimate(fallback_rate=0.25) == [0.0] * len(SPLITS)
    assert dry_run_sample.Tally().tokens_per_byte(0.25) == 0.25
