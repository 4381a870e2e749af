"""Helpers of the retrieval end-to-end tests (tests/e2e/test_retrieval_*.py): a small sharded dataset of the
good corpus, and a byte-for-byte comparison of two output trees."""
from __future__ import annotations

import filecmp
import pathlib

from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from tests.corpus_fixtures import write_good_corpus

SEQ_LEN = 128
IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


def small_dataset(tokenizer: str, corpus: pathlib.Path, out: pathlib.Path, limit_bytes: int) -> pathlib.Path:
    """`limit_bytes` of the good corpus in 2 files, sharded at SEQ_LEN into 2 shards with a val split."""
    write_good_corpus(corpus, limit_bytes=limit_bytes, files=2)
    config = ShardConfig(inputs=(str(corpus / "*"),), output=str(out), tokenizer=tokenizer, seq_len=SEQ_LEN,
                         num_shards=2, val_fraction=0.1, test_fraction=0.0, unit_mb=0.05)
    shard_pipeline.run(config, IN_MEMORY)
    return out


def same_tree(a: pathlib.Path, b: pathlib.Path) -> None:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert filecmp.cmp(a / rel, b / rel, shallow=False), f"{rel} differs"
