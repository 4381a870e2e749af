"""What the near-dedup stage leaves in the dataset's manifest (Beam-free): its section (removals per reason and
source, the stage's summary file) and every generation's band index rows.

Read by the manifest's assembly and merge (pipeline/shard/integrity.py) and written by the stage
(partitions.py); kept apart from the stage's Beam graph so that the manifest code does not import it, which
imports the manifest code back (that closed the cycle ops/guards -> shard/integrity -> the near-dedup graph ->
shard/resume -> ops/guards).
"""
from __future__ import annotations

import json

from transforms.io import io_utils
from transforms.shard.near_dedup import paths

BAND_INDEXES = "near_dedup_band_indexes"  # manifest section: every generation's band index files


def manifest_section(shard_results: list, output_dir: str, generation: str) -> tuple:
    """(the manifest's `near_dedup` section, its band index rows): removed documents per reason and source (every
    copy the packers filtered) and the stage's summary (cluster sizes, example pairs, sidecar files with their
    sha256); [BandIndexRow] of the generation's band index, or None. (None, None) when the stage did not run."""
    from model_contract.manifest_rows import BandIndexRow  # noqa: PLC0415

    data_dir = io_utils.join(output_dir, generation)
    path = paths.summary(data_dir)
    if not io_utils.exists(path):
        return None, None
    summary = json.loads(io_utils.read_bytes(path))
    by_source: dict = {}
    for s in shard_results:
        for reason, per in getattr(s, "filtered_per_source", {}).items():
            for source, n in per.items():
                by_source.setdefault(reason, {})
                by_source[reason][source] = by_source[reason].get(source, 0) + n
    summary["removed_by_source"] = {r: dict(sorted(v.items())) for r, v in sorted(by_source.items())}
    rows = [BandIndexRow(generation, b["range"], b["path"], b["bytes"], b["sha256"])
            for b in summary.get("band_index") or []]
    return summary, rows or None


def merge_band_indexes(previous, new):
    """After an incremental commit the dataset lists every generation's band index (the next run reads them):
    [BandIndexRow], or None when no generation has one."""
    rows = list(previous.band_indexes or []) + list(new.band_indexes or [])
    return rows or None
