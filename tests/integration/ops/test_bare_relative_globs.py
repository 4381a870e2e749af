"""`shard --input 'c*.jsonl'` and `tokenizer train --input 'c*.jsonl'` take a bare relative glob, through the whole
job (the matching itself: tests/unit/ops/test_bare_relative_globs.py; docs/wip/hostile-review-issue28.md F8)."""
from __future__ import annotations

from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from pipeline.tools.tokenizer_train import train_tokenizer
from tests.corpus_fixtures import good_documents
from tests.ops_fixtures import FAST_LOCAL
from tests.unit.ops.test_bare_relative_globs import corpus_dir  # noqa: F401 - the fixture


def test_shard_and_tokenizer_train_take_a_bare_relative_glob(corpus_dir):
    summary = train_tokenizer(["c*.jsonl"], str(corpus_dir / "tok.model"), 600, max_sentences=400)
    assert summary["files"] == 2, summary
    config = ShardConfig(inputs=("c*.jsonl",), output=str(corpus_dir / "ds"), tokenizer=str(corpus_dir / "tok.model"),
                         seq_len=64, num_shards=1, val_fraction=0.0, test_fraction=0.0)
    manifest = shard_pipeline.run(config, FAST_LOCAL, progress_every_s=0)
    assert sorted(row["path"] for row in manifest["ledger"]) == ["c1.jsonl", "c2.jsonl"]
    assert manifest["records"]["read"] == len(good_documents(40_000))
