"""How big the cut stage cuts its chunks (the tokenize stage's work units): `--unit-mb`, subdivided when the
input is small next to it.

A small input cut at `--unit-mb` alone gives a few units (one per file below 32 MiB), and the tokenize stage
then waits for the last, largest one on one core while the others idle: FnApiRunner hands each worker a fixed
share of the stage's elements (round robin, no rebalancing), so only many small units even the shares out.
The chunk size is therefore `--unit-mb` halved until the input is estimated to give `UNITS_WANTED` units,
never below `MIN_CHUNK_BYTES` (each unit costs its files, a completion marker with the sha256 of its files,
and one ranged read per shard when packing).

The rule reads the input ledger (path and size of every input file) and `--unit-mb`, never the worker count.
Both are in the run's fingerprint, which names the staging directory (pipeline/ops/guards.py), so a rerun of a
killed run cuts the same chunks and its completion markers (pipeline/shard/markers.py) stay valid when the
worker count or the runner changes. The price: `UNITS_WANTED` is fixed at 4 units for each of 16 workers, so
a run with more workers than that on a small input gets fewer than 4 units per worker (lower `--unit-mb`).
Sizing to the actual workers instead would make every marker of a killed run useless on a rerun with another
worker count. Output bytes do not depend on the unit plan: shards are key ranges merged over all units
(transforms/shard/pack.py pack_shard).
"""
from __future__ import annotations

import math

from transforms.io.read_records import compression_of

UNITS_WANTED = 64  # at least 4 units per worker for up to 16 workers
MIN_CHUNK_BYTES = 1 << 20
# Raw (decompressed) bytes per stored byte assumed for a compressed input: JSON lines of English text compress
# 3-4x with zstd and gzip. The low end: the estimate errs towards more (smaller) units, never towards fewer.
RAW_PER_COMPRESSED_BYTE = 3


def raw_bytes_estimate(path: str, size: int) -> int:
    """Raw bytes a ledger file is expected to give the cut stage (chunks are cut on raw bytes)."""
    return size * (1 if compression_of(path) == "none" else RAW_PER_COMPRESSED_BYTE)


def units_estimate(ledger, chunk_bytes: int) -> int:
    """Units the cut stage is expected to cut at `chunk_bytes` (at least one per non-empty file)."""
    return sum(max(1, math.ceil(raw_bytes_estimate(e.path, e.size) / chunk_bytes)) for e in ledger if e.size)


def chunk_bytes_for(ledger, unit_bytes: int) -> int:
    """Raw bytes per chunk for this input: `unit_bytes` / 2**k for the smallest k that gives `UNITS_WANTED`
    units, no smaller than `MIN_CHUNK_BYTES` (and never above `unit_bytes`).
    `ledger`: [LedgerEntry] (transforms/shard/records.py)."""
    chunk = unit_bytes
    while chunk // 2 >= MIN_CHUNK_BYTES and units_estimate(ledger, chunk) < UNITS_WANTED:
        chunk //= 2
    return chunk


def whole_files_balance(ledger, workers: int) -> bool:
    """Whether whole input files, dealt round robin to `workers` local workers, keep them evenly busy, so that
    cut and tokenize may fuse per file (pipeline/shard/graph.py spread_chunks_needed): at least 4
    files per worker, and with more than one worker no file over half a worker's share of the raw bytes.

    A worker then waits at the stage's end for at most a fraction of a share. One 48 MB file among eight of
    3 MB, fused, left 2.4 of 4.2 tokenize CPU-s as idle core-s on 2 workers; spreading its chunks, 0.4
    (docs/BENCHMARKS.md). This decides the graph's shape only, never the units or the bytes."""
    if len(ledger) < 4 * max(1, workers):
        return False
    if workers <= 1:
        return True
    raws = [raw_bytes_estimate(e.path, e.size) for e in ledger]
    return max(raws) * 2 * workers <= sum(raws)
