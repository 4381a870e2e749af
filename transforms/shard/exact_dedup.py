"""Exact dedup across shards: the held-out splits' ids listed once (`index_held_out_ids`), the packer's test
against them and the committed generations (`duplicate_mask`), and the generation's id index the commit
writes from the shards' kept ids (`write_generation_id_index`). Copies inside one shard are the packer's
(transforms/shard/pack.py): they share a sort key, so they meet there.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from transforms.io import io_utils
from transforms.shard import doc_ids, layout
from transforms.shard.documents import SPLIT_SHIFT, SPLITS
from transforms.shard.layout import Layout
from transforms.shard.records import DedupInputs, ShardResult, UnitResult
from transforms.shard.spill import read_index_range, read_index_rows


def index_held_out_ids(units: list[UnitResult], staging_dir: str) -> DedupInputs:
    """The one global dedup step: every val and test document id, sorted, one small file per split.

    Reads only the held-out rows of each unit's index (they sit at the end, the split being the key's top bits;
    tokenize recorded where they start, so one ranged read per unit and no search), so the cost follows the
    held-out documents, and memory is 8 bytes per held-out id."""
    parts = {split: [] for split in range(1, len(SPLITS))}
    for unit in units:
        if unit.n_docs == 0:
            continue
        with io_utils.open_read(unit.index_path) as f:
            if unit.held_out_start is None:
                rows = read_index_range(f, unit.n_docs, 1 << SPLIT_SHIFT, len(SPLITS) << SPLIT_SHIFT)
            elif unit.held_out_start < unit.n_docs:
                rows = read_index_rows(f, unit.held_out_start, unit.n_docs - unit.held_out_start)
            else:
                continue
        split_of_row = rows["key"] >> np.uint64(SPLIT_SHIFT)
        for split in parts:
            parts[split].append(rows["doc_id"][split_of_row == split])
    held_out = []
    for split, arrays in parts.items():
        path = Layout(staging_dir, "").path(layout.held_out_ids(SPLITS[split]))
        with io_utils.open_write(path) as f:
            doc_ids.write_sorted_ids(f, np.concatenate(arrays) if arrays else np.zeros(0, doc_ids.ID_DTYPE))
        held_out.append((split, path))
    return DedupInputs(held_out=tuple(held_out))


def duplicate_mask(rows: np.ndarray, split: int, dedup: Optional[DedupInputs]) -> np.ndarray:
    """Which of a shard's index rows are copies of a document kept elsewhere (winning split or committed)."""
    dup = np.zeros(rows.size, dtype=bool)
    if dedup is None or rows.size == 0:
        return dup
    ids = rows["doc_id"]
    for path in dedup.losers_to(split):
        dup |= doc_ids.member_of_sorted(ids, doc_ids.read_sorted_ids(path))
    for path in dedup.committed:
        dup |= doc_ids.IdIndex(path).contains(ids)
    return dup



def write_generation_id_index(shard_results: list[ShardResult], data_dir: str) -> tuple[str, int, int, str]:
    """Merge the shards' kept ids into the generation's id index; returns (path, documents, bytes, sha256)."""
    path = Layout("", data_dir).path(layout.generation_id_index())
    paths = [r.ids_path for r in sorted(shard_results, key=lambda r: (r.task.split, r.task.shard)) if r.ids_path]
    # Kept ids are unique across the generation's shards (one split and one shard per id), so n is their sum.
    n, size, sha = doc_ids.write_index(path, doc_ids.merge_sorted_files(paths),
                                       sum(r.ids_count for r in shard_results))
    return path, n, size, sha

