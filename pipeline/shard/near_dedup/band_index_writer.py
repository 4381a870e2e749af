"""The generation's band index (transforms/shard/near_dedup/band_index.py), written once the removals are known:
per key range, the staged band rows of the documents the generation keeps, window by window (windows.py)."""
from __future__ import annotations

import numpy as np

from pipeline.shard.near_dedup import band_files
from pipeline.shard.near_dedup.elements import BandIndexWritten, IndexTask, PartitionWritten, UnitBands
from pipeline.shard.near_dedup.windows import RangeWindows
from transforms.io import io_utils
from transforms.shard import doc_ids
from transforms.shard.near_dedup import band_index, paths
from transforms.shard.near_dedup.band_index import BAND_RANGES


def band_index_tasks(gathered: list) -> list:
    """One IndexTask per band-key range once every removal partition is written."""
    names = tuple(sorted(e.unit_name for e in gathered if isinstance(e, UnitBands)))
    indexes = tuple(sorted(tuple(i) for p in gathered if isinstance(p, PartitionWritten) for i in p.indexes))
    return [IndexTask(r, names, indexes) for r in range(BAND_RANGES)]


def write_band_index_range(task: IndexTask, plan) -> BandIndexWritten:
    """One range of the generation's band index: the staged band rows of that range, less every removed id.
    Window by window (RangeWindows), appended in key order: encode_arrays sorts by (key, id) and keeps one row
    per (key, id), and one key lies in one window, so the bytes are those of encoding the whole range at once."""
    num_perm = plan.config.near_dedup_config.params.num_perm
    removed_ids = [doc_ids.IdIndex(path) for _reason, path in task.indexes]
    path = paths.band_index(plan.data_dir, task.range)
    with io_utils.open_write(path) as raw, io_utils.HashingWriter(raw) as out:
        for parts, _committed in RangeWindows(plan, task.range, task.unit_names, (), num_perm).windows():
            out.write(_window_index_bytes(plan, parts, removed_ids, num_perm))
    return BandIndexWritten(task.range, path, out.bytes // band_index.row_dtype(num_perm).itemsize, out.bytes,
                            out.sha256)


def _window_index_bytes(plan, parts: list, removed_ids: list, num_perm: int) -> bytes:
    parts = [(name, a) for name, a in parts if a.size]
    if not parts:
        return b""
    rows = np.concatenate([a for _n, a in parts])
    removed = np.zeros(rows.size, dtype=bool)
    for index in removed_ids:
        removed |= index.contains(rows["doc_id"].astype(doc_ids.ID_DTYPE))
    kept = ~removed
    # the kept rows' signatures only, gathered per unit (a document's row in its unit's table)
    sigs, start = [], 0
    for name, a in parts:
        k = kept[start:start + a.size]
        sigs.append(band_files.unit_sig_rows(plan, name, a["doc"][k].astype(np.int64)))
        start += a.size
    return band_index.encode_arrays(rows["key"][kept], rows["doc_id"][kept], rows["split"][kept],
                                    np.concatenate(sigs), num_perm)
