"""The removal lists the near-dedup stage stages for the packers, and the packers' lookup in them.

The near-dedup stage (pipeline/shard/near_dedup/partitions.py) ends by writing, per partition of the document ids
(id % PARTITIONS), one id index (transforms/shard/doc_ids.py layout) per removal reason, and one marker,
`near-dedup/removals.json`, listing them. A packer (transforms/shard/pack.py `pack_shard`) asks each index
about its shard's ids: memory per packer is the indexes' fences plus one block, whatever the number of removed
documents. No marker in the staging directory: the run has no near-dedup stage, nothing is removed.
"""
from __future__ import annotations

import json
from typing import Optional

import numpy as np

from transforms.io import io_utils
from transforms.shard import doc_ids
from transforms.shard.near_dedup import paths

PARTITIONS = 16
NEAR_DUPLICATE = "near_duplicate"
NEAR_DUPLICATE_OF_COMMITTED = "near_duplicate_of_committed"
CONTAMINATED = "contaminated"
REASONS = (NEAR_DUPLICATE, NEAR_DUPLICATE_OF_COMMITTED, CONTAMINATED)  # precedence when one id has two rows


def partition_of(doc_id: int) -> int:
    return int(doc_id) % PARTITIONS


def write_marker(staging_dir: str, indexes: list, contaminated_splits: list) -> str:
    """`indexes`: [(reason, path)] of every non-empty index. Written once, by the stage's last step."""
    path = paths.removals_marker(staging_dir)
    body = {"indexes": [[r, p] for r, p in sorted(indexes)], "contaminated_splits": sorted(contaminated_splits)}
    io_utils.write_bytes(path, json.dumps(body, sort_keys=True).encode("utf-8"))
    return path


def load(staging_dir: Optional[str]) -> Optional[dict]:
    if staging_dir is None:
        return None
    path = paths.removals_marker(staging_dir)
    if not io_utils.exists(path):
        return None
    return json.loads(io_utils.read_bytes(path))


def reasons_for(doc_id_column: np.ndarray, split: int, staging_dir: Optional[str]) -> Optional[list]:
    """Per row of a shard: the removal reason ('' = kept), or None when the run removes nothing this way.

    Contamination applies to the splits the run checked (train, and val/test with --decontaminate-held-out);
    a held-out copy that was not checked stays, and its train copies are exact duplicates of it anyway."""
    marker = load(staging_dir)
    if marker is None:
        return None
    out = [""] * len(doc_id_column)
    ids = np.asarray(doc_id_column, dtype=doc_ids.ID_DTYPE)
    for reason in reversed(REASONS):  # earlier reasons win: written last
        if reason == CONTAMINATED and split not in marker["contaminated_splits"]:
            continue
        for r, path in marker["indexes"]:
            if r != reason or not ids.size:
                continue
            for i in np.flatnonzero(doc_ids.IdIndex(path).contains(ids)).tolist():
                out[i] = reason
    return out
