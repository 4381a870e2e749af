"""Every file the near-dedup and decontamination stage writes, named once: in the run's staging directory (what
the stage hands between its own steps and to the packers) and in the partial generation (what the dataset
keeps). The tokenize stage's per-unit signatures are named with its other staging files (transforms/shard/
layout.py). Names depend only on the unit, range or partition, so a retried bundle rewrites the same bytes.
"""
from __future__ import annotations

from transforms.io import io_utils

STAGE_DIR = "near-dedup"  # below the staging directory and below the generation
REMOVALS_MARKER = f"{STAGE_DIR}/removals.json"  # the packers' list of removal indexes (removals.py)
SUMMARY = f"{STAGE_DIR}/summary.json"  # the generation's summary, read into the manifest
BAND_INDEX = STAGE_DIR + "/band-index-r{:02d}.bin"  # by key range: the generation's band index (band_index.py)


# ------------------------------------------------------------------------------------------- in staging
def shingles(staging_dir: str, unit_name: str) -> str:
    """A unit's sorted shingles, for --near-dedup-verify (uint64, the documents one after another)."""
    return io_utils.join(staging_dir, STAGE_DIR, "shingles", unit_name + ".u64")


def band_rows(staging_dir: str, unit_name: str, r: int) -> str:
    """A unit's band rows of key range r, sorted by (key, row)."""
    return io_utils.join(staging_dir, STAGE_DIR, "bands", f"{unit_name}-r{r:02d}.rows")


def band_signatures(staging_dir: str, unit_name: str) -> str:
    """A unit's signature table: one row per document its band rows point into."""
    return io_utils.join(staging_dir, STAGE_DIR, "bands", f"{unit_name}.sigs")


def band_documents(staging_dir: str, unit_name: str) -> str:
    """A unit's documents' (source, location), in the signature table's order."""
    return io_utils.join(staging_dir, STAGE_DIR, "bands", f"{unit_name}.docs.pickle")


def window_offsets(staging_dir: str, unit_name: str) -> str:
    """A unit's window offsets: per key range, (WINDOW_GRAIN + 1) little-endian uint32, the row of its range file
    where each fine window of keys starts (the last: the file's row count). A key-range task reads one range's
    row of them (16 kB) and then each window's slice of the range file by a ranged read."""
    return io_utils.join(staging_dir, STAGE_DIR, "bands", f"{unit_name}.windows")


def removal_index(staging_dir: str, reason: str, partition: int) -> str:
    """The ids of one id partition removed for one reason (transforms/shard/doc_ids.py layout)."""
    return io_utils.join(staging_dir, STAGE_DIR, f"removed-{reason}-p{partition:03d}.idx")


def removals_marker(staging_dir: str) -> str:
    return io_utils.join(staging_dir, REMOVALS_MARKER)


# ------------------------------------------------------------------------------------ in the generation
def sidecar(data_dir: str, partition: int) -> str:
    """One id partition's removed documents, one JSON line each (the dataset's record of every removal)."""
    return io_utils.join(data_dir, STAGE_DIR, f"removed-p{partition:03d}.jsonl")


def summary(data_dir: str) -> str:
    return io_utils.join(data_dir, SUMMARY)


def band_index(data_dir: str, r: int) -> str:
    return io_utils.join(data_dir, BAND_INDEX.format(r))
