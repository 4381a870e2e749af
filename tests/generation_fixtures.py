"""A two-generation dataset without ../shared/data: two `--incremental` runs with the tiny tokenizer.

Both generations hold shards of the same basenames (`gen-A/train-00000-of-00001.tfrecord`,
`gen-B/train-00000-of-00001.tfrecord`), which is what a per-shard output named by basename overwrites.
"""
from __future__ import annotations

import pathlib

from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from tests.corpus_fixtures import pile_line, good_documents, write_zst
from tests.ops_fixtures import FAST_LOCAL


def two_generation_dataset(root: pathlib.Path, tokenizer: str, seq_len: int = 128) -> tuple:
    """(dataset dir, committed manifest dict) after two incremental runs adding one input file each."""
    inbox, out = root / "inbox", root / "ds"
    inbox.mkdir(parents=True)
    docs = good_documents(160_000)
    config = ShardConfig(inputs=(str(inbox / "*"),), output=str(out), tokenizer=tokenizer, seq_len=seq_len,
                         num_shards=1, val_fraction=0.0, test_fraction=0.0)
    manifest = None
    for gen in range(2):
        write_zst(inbox / f"{gen:02d}.jsonl.zst", [pile_line(t, s) for t, s in docs[gen::2]])
        manifest = shard_pipeline.run(config, FAST_LOCAL, incremental_run=True, progress_every_s=0)
    names = [s["path"].rsplit("/", 1)[-1] for s in manifest["shards"]]
    assert len(manifest["generations"]) == 2 and len(set(names)) < len(names), manifest["shards"]
    return out, manifest
