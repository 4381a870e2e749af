"""A dataset with several committed generations kept side by side, from real shard runs (no ../shared/data).

Each run replaces the input (not `--incremental`), so every generation is a full dataset of its own and the
previous ones are kept only by `--keep-generations` (pipeline/ops/generations.py): the layout the hostile review
forged `commit_seq` values and planted links in (docs/wip/hostile-review-issue28.md F5, F6).
"""
from __future__ import annotations

import os
import pathlib
import shutil

from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from tests.corpus_fixtures import good_documents, pile_line, write_zst
from tests.ops_fixtures import FAST_LOCAL

SHARD = "train-00000-of-00001.tfrecord"


def shard_config(inbox: pathlib.Path, out: pathlib.Path, tokenizer: str, keep: int) -> ShardConfig:
    return ShardConfig(inputs=(str(inbox / "*"),), output=str(out), tokenizer=tokenizer, seq_len=128, num_shards=1,
                       val_fraction=0.0, test_fraction=0.0, keep_generations=keep)


def generation_history(root: pathlib.Path, tokenizer: str, commits: int = 3) -> tuple:
    """(inbox, dataset dir, generation names oldest first): `commits` runs, each on a different input, all kept."""
    inbox, out = root / "inbox", root / "ds"
    inbox.mkdir(parents=True)
    docs = good_documents(120_000)
    names = []
    for n in range(commits):
        for old in inbox.iterdir():
            old.unlink()
        write_zst(inbox / f"{n:02d}.jsonl.zst", [pile_line(t, s) for t, s in docs[n::commits]])
        names.append(shard_pipeline.run(shard_config(inbox, out, tokenizer, commits), FAST_LOCAL,
                                        progress_every_s=0)["generation"])
    assert sorted(p.name for p in out.glob("gen-*")) == sorted(names) and len(set(names)) == commits
    return inbox, out, names


def copy_of(dataset: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    shutil.copytree(dataset, dest, symlinks=True)
    return dest


def tree(root: pathlib.Path) -> dict:
    """Relative path -> bytes (files) or link target (links) of everything under `root`, never following a link."""
    out = {}
    for directory, dirs, files in os.walk(root):  # never descends into a link to a directory
        for name in dirs + files:
            p = pathlib.Path(directory, name)
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_file():
                out[rel] = p.read_bytes()
    return dict(sorted(out.items()))
