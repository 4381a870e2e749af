"""The chunk size the cut stage cuts at (pipeline/shard/unit_plan.py): `--unit-mb` subdivided for a small
input, from the ledger and `--unit-mb` alone (never the worker count: resume markers depend on it)."""
from __future__ import annotations

import inspect

from pipeline.shard import unit_plan
from transforms.shard.records import LedgerEntry
from pipeline.shard.unit_plan import MIN_CHUNK_BYTES, UNITS_WANTED, chunk_bytes_for, units_estimate

MiB = 1 << 20
UNIT = 32 * MiB


def test_a_big_input_keeps_the_unit_size():
    ledger = [LedgerEntry(f"part{i:02d}.jsonl.zst", 4 << 30) for i in range(30)]  # the Pile's 30 train files
    assert chunk_bytes_for(ledger, UNIT) == UNIT


def test_a_small_input_is_subdivided_to_the_wanted_units():
    ledger = [LedgerEntry(f"f{i}.jsonl", 16 * MiB) for i in range(6)]  # 96 MiB raw: 6 units at --unit-mb 32
    chunk = chunk_bytes_for(ledger, UNIT)
    assert chunk < UNIT and UNIT % chunk == 0  # a unit cut in 2**k equal parts
    assert units_estimate(ledger, chunk) >= UNITS_WANTED
    assert units_estimate(ledger, chunk * 2) < UNITS_WANTED  # the largest such chunk: no needless units


def test_compressed_inputs_are_estimated_at_their_raw_size():
    plain = [LedgerEntry("a.jsonl", 48 * MiB)]
    zst = [LedgerEntry("a.jsonl.zst", 16 * MiB)]  # ~48 MiB raw
    assert chunk_bytes_for(zst, UNIT) == chunk_bytes_for(plain, UNIT)
    assert unit_plan.raw_bytes_estimate("a.jsonl.gz", 10) == 10 * unit_plan.RAW_PER_COMPRESSED_BYTE


def test_never_below_the_floor_nor_above_unit_mb():
    tiny = [LedgerEntry("one.jsonl", 1000)]
    assert chunk_bytes_for(tiny, UNIT) == MIN_CHUNK_BYTES
    assert chunk_bytes_for(tiny, MIN_CHUNK_BYTES // 4) == MIN_CHUNK_BYTES // 4  # a small --unit-mb is kept
    assert chunk_bytes_for([], UNIT) == MIN_CHUNK_BYTES
    assert chunk_bytes_for([LedgerEntry("empty.jsonl", 0)], UNIT) == MIN_CHUNK_BYTES


def test_the_plan_depends_on_the_ledger_and_unit_mb_only():
    # No worker count, runner or clock among its inputs: markers of a killed run survive a rerun with other
    # workers (pipeline/shard/resume.py). The same inputs always give the same chunk size, in any order.
    assert list(inspect.signature(chunk_bytes_for).parameters) == ["ledger", "unit_bytes"]
    ledger = [LedgerEntry(f"f{i}.jsonl.zst", (i + 1) * MiB) for i in range(5)]
    assert chunk_bytes_for(ledger, UNIT) == chunk_bytes_for(list(reversed(ledger)), UNIT)


def test_whole_files_balance_only_when_none_outweighs_half_a_share():
    even = [LedgerEntry(f"f{i}.jsonl.zst", 2 * MiB) for i in range(8)]
    assert unit_plan.whole_files_balance(even, 2)
    assert not unit_plan.whole_files_balance(even[:7], 2)  # fewer than 4 files per worker
    uneven = [LedgerEntry("big.jsonl.zst", 10 * MiB)] + [LedgerEntry(f"s{i}.jsonl.zst", MiB // 2) for i in range(8)]
    assert not unit_plan.whole_files_balance(uneven, 2)  # the big file would hold one core alone
    assert unit_plan.whole_files_balance(uneven, 1)  # one worker: nothing to even out
    assert not unit_plan.whole_files_balance([], 1)
