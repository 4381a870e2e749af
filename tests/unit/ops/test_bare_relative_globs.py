"""A relative input glob with no directory part (`c*.jsonl`) matches like `./c*.jsonl` (pipeline/ops/input_checks.py
match_input): Beam's local filesystem lists nothing for it, so `shard --input 'c*.jsonl'` and
`tokenizer train --input 'c*.jsonl'` failed with "matches nothing" (docs/wip/hostile-review-issue28.md F8)."""
from __future__ import annotations

import pytest

from pipeline.config import ShardConfig
from pipeline.ops import incremental
from pipeline.ops.input_checks import match_input
from pipeline.shard import shard_pipeline
from pipeline.tools.tokenizer_train import train_tokenizer
from tests.corpus_fixtures import good_documents, pile_line
from tests.ops_fixtures import FAST_LOCAL


@pytest.fixture
def corpus_dir(tmp_path, monkeypatch):
    """Two small jsonl inputs and an unrelated file in the working directory, plus one in a subdirectory."""
    docs = good_documents(40_000)
    (tmp_path / "c1.jsonl").write_bytes(b"".join(pile_line(t, s) for t, s in docs[0::2]))
    (tmp_path / "c2.jsonl").write_bytes(b"".join(pile_line(t, s) for t, s in docs[1::2]))
    (tmp_path / "other.txt").write_bytes(b"not an input")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c3.jsonl").write_bytes(pile_line(*docs[0]))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("pattern, expected", [
    ("c*.jsonl", ["c1.jsonl", "c2.jsonl"]),
    ("c?.jsonl", ["c1.jsonl", "c2.jsonl"]),
    ("[c]1.jsonl", ["c1.jsonl"]),
    ("*/c*.jsonl", ["sub/c3.jsonl"]),
    ("./c*.jsonl", ["./c1.jsonl", "./c2.jsonl"]),  # the form written is the form recorded
    ("sub/c*.jsonl", ["sub/c3.jsonl"]),
    ("c1.jsonl", ["c1.jsonl"]),
])
def test_a_relative_glob_matches_what_the_shell_would(corpus_dir, pattern, expected):
    assert sorted(m.path for m in match_input(pattern)) == expected
    assert [r["path"] for r in incremental.list_inputs([pattern])] == expected


def test_an_absolute_glob_is_unchanged(corpus_dir):
    assert sorted(m.path for m in match_input(str(corpus_dir / "c*.jsonl"))) == \
        [str(corpus_dir / "c1.jsonl"), str(corpus_dir / "c2.jsonl")]


def test_shard_and_tokenizer_train_take_a_bare_relative_glob(corpus_dir):
    summary = train_tokenizer(["c*.jsonl"], str(corpus_dir / "tok.model"), 600, max_sentences=400)
    assert summary["files"] == 2, summary
    config = ShardConfig(inputs=("c*.jsonl",), output=str(corpus_dir / "ds"), tokenizer=str(corpus_dir / "tok.model"),
                         seq_len=64, num_shards=1, val_fraction=0.0, test_fraction=0.0)
    manifest = shard_pipeline.run(config, FAST_LOCAL, progress_every_s=0)
    assert sorted(row["path"] for row in manifest["ledger"]) == ["c1.jsonl", "c2.jsonl"]
    assert manifest["records"]["read"] == len(good_documents(40_000))
