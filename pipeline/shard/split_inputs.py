"""Which split each input file feeds: `--input` files are split by document hash, `--val-input` and
`--test-input` files go wholly to val / test (the Pile ships official `val.jsonl.zst` and `test.jsonl.zst`).

Listing happens once on the driver (the ledger); this module only tags each listed file with its split and
refuses a file claimed by two flags (it could not be whole in both).
"""
from __future__ import annotations

import logging

from pipeline.config import ShardConfig
from pipeline.errors import ConfigError
from pipeline.ops import incremental
from transforms.shard.documents import HASHED, SPLITS, looks_like_held_out

LOG = logging.getLogger("pileprep.splits")


def list_inputs_with_splits(config: ShardConfig) -> tuple:
    """(ledger rows sorted by path, {path: HASHED | split}) for every --input, --val-input and --test-input."""
    roles = [("--input", config.inputs, HASHED), ("--val-input", config.val_inputs, SPLITS.index("val")),
             ("--test-input", config.test_inputs, SPLITS.index("test"))]
    rows, split_of_path, flag_of_path = {}, {}, {}
    for flag, globs, split in roles:
        if not globs:
            continue
        for row in incremental.list_inputs(globs):
            path = row["path"]
            if path in flag_of_path and flag_of_path[path] != flag:
                raise ConfigError(f"{path} is matched by both {flag_of_path[path]} and {flag}; a file feeds one "
                                  "split (narrow one of the globs)")
            rows[path], split_of_path[path], flag_of_path[path] = row, split, flag
    return [rows[p] for p in sorted(rows)], split_of_path


def held_out_name_warnings(split_of_path: dict) -> list:
    """Train inputs whose file name says val/valid/test: probably meant for --val-input / --test-input."""
    return [f"--input {path}: the name says val/test but the file is split by hash like train data; pass it "
            "with --val-input / --test-input to keep it whole in that split"
            for path, split in sorted(split_of_path.items()) if split == HASHED and looks_like_held_out(path)]


def input_splits_for(ledger: list, split_of_path: dict) -> tuple:
    """Per file_idx (position in the ledger) the split its documents go to, for the tokenize stage."""
    return tuple(split_of_path.get(e.path, HASHED) for e in ledger)
