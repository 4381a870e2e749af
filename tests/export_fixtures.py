"""A small committed dataset for the export tests (tests/integration/tools/test_export.py, tests/e2e/test_export_s3.py):
write_good_corpus's documents sharded in memory with the tiny tokenizer."""
from __future__ import annotations

from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from tests.corpus_fixtures import write_good_corpus

IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


def build_dataset(tmp_path_factory, tokenizer: str, limit_bytes: int, **overrides) -> tuple:
    """(dataset directory, its manifest) of a corpus of about `limit_bytes`, seq_len 128."""
    root = tmp_path_factory.mktemp("export-corpus")
    write_good_corpus(root, limit_bytes=limit_bytes)
    out = tmp_path_factory.mktemp("export-out") / "ds"
    config = ShardConfig(inputs=(str(root / "*"),), output=str(out), tokenizer=tokenizer, seq_len=128,
                         **{"num_shards": 3, "val_fraction": 0.05, "test_fraction": 0.05, **overrides})
    return out, shard_pipeline.run(config, IN_MEMORY, progress_every_s=0)
