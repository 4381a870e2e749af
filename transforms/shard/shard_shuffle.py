"""The runner's shuffle (docs/SHUFFLE.md, design D): each tokenized unit is cut into per-shard pieces once, the
runner's GroupByKey moves them, and a packer merges one shard's pieces.

Why: with the file spill (`pack.pack_shard` alone), every pack task searches every unit's index and reads one
range from each, units × shards requests, tens of millions at Pile scale. Here a unit is read with two requests
(its whole index, its whole tokens file) and the data moves once, through a shuffle that Dataflow, Flink and
Spark batch and spill themselves. The packer gets the same rows (`pack.merge_shard_parts` orders them totally)
and packs them with the same code, so the shards and their results are byte-identical to the file spill's.

Pure functions and small picklable values; the Beam wiring is pipeline/shard/runner_shuffle.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import numpy as np

from transforms.io import io_utils
from transforms.shard.documents import SPLITS, shard_key_range
from transforms.shard.spill import INDEX_DTYPE, read_token_range
from transforms.shard.pack import merge_shard_parts
from transforms.shard.records import DedupInputs, ShardTask


@dataclass(frozen=True)
class ShardPlan:
    """What every unit needs to cut itself: the shard count per split (0: the split has none) and the dedup
    inputs the packers use. A few numbers, not the task list, so carrying it with each unit stays cheap."""
    num_shards: tuple[int, ...]  # per split, in SPLITS order
    dedup: Optional[DedupInputs] = None

    @classmethod
    def from_tasks(cls, tasks: list, dedup: Optional[DedupInputs]) -> "ShardPlan":
        counts = [0] * len(SPLITS)
        for task in tasks:
            counts[task.split] = task.num_shards
        return cls(tuple(counts), dedup)

    def tasks(self) -> list:
        return [ShardTask(split, shard, n) for split, n in enumerate(self.num_shards) for shard in range(n)]


@dataclass(frozen=True)
class ShardPiece:
    """One unit's documents in one shard's key range: index rows in key order and their tokens, as bytes.

    Carries what the packer reads of a unit (input path, source names), so a piece stands in for the unit."""
    unit_name: str
    input_path: str
    sources: tuple[str, ...]  # source names; rows refer to them by position
    token_dtype: str
    rows: bytes  # INDEX_DTYPE records, token_start still relative to the unit's tokens file
    tokens: bytes


@dataclass(frozen=True)
class ShardMarker:
    """Sent to every planned shard, so a shard no unit has documents for is still packed (an empty file)."""
    task: ShardTask
    dedup: Optional[DedupInputs] = None


def shard_key(task: ShardTask) -> tuple:
    return task.split, task.shard


def markers(plan: ShardPlan) -> Iterator[tuple]:
    """((split, shard), ShardMarker) for every planned shard."""
    for task in plan.tasks():
        yield shard_key(task), ShardMarker(task, plan.dedup)


def read_unit(unit) -> tuple:
    """(index, tokens) of a tokenized unit (records.UnitResult): two whole-file reads."""
    index = np.frombuffer(io_utils.read_bytes(unit.index_path), dtype=INDEX_DTYPE)
    if index.size != unit.n_docs:
        raise IOError(f"{unit.index_path}: holds {index.size} index rows, the tokenize stage wrote {unit.n_docs}")
    total = int(index["token_start"][-1] + index["n_tokens"][-1]) if index.size else 0
    with io_utils.open_read(unit.tokens_path) as f:
        tokens = read_token_range(f, np.dtype(unit.token_dtype), 0, total)
    return index, tokens


def cut_unit(unit, index: np.ndarray, tokens: np.ndarray, plan: ShardPlan) -> Iterator[tuple]:
    """((split, shard), ShardPiece) for every planned shard this unit has documents in.

    The index is sorted by key and the tokens follow it, so each shard's part is one row slice and one token
    slice, found by one searchsorted over every planned shard's boundaries."""
    tasks = plan.tasks()
    bounds = np.array([shard_key_range(t.split, t.shard, t.num_shards) for t in tasks], dtype=np.uint64)
    edges = np.searchsorted(index["key"], bounds.reshape(-1), side="left").reshape(-1, 2)
    for task, (first, last) in zip(tasks, edges):
        if last <= first:
            continue
        rows = index[first:last]
        start = int(rows["token_start"][0])
        end = int(rows["token_start"][-1] + rows["n_tokens"][-1])
        yield shard_key(task), ShardPiece(unit.name, unit.input_path, tuple(unit.sources), unit.token_dtype,
                                          rows.tobytes(), tokens[start:end].tobytes())


def gather_pieces(key: tuple, values: Iterable) -> tuple:
    """(task, dedup, pieces, gathered) for `pack.pack_shard(task, pieces, ..., dedup, gathered=gathered)`
    from one shard's grouped values (its marker and its pieces, in any order)."""
    marker_list, pieces = [], []
    for value in values:
        (marker_list if isinstance(value, ShardMarker) else pieces).append(value)
    if len(marker_list) != 1:
        raise ValueError(f"shard {key}: expected one plan marker, got {len(marker_list)} "
                         f"({len(pieces)} pieces): a piece for a shard that was never planned")
    marker = marker_list[0]
    pieces.sort(key=lambda p: p.unit_name)  # placement only; merge_shard_parts' order is total
    parts, buffers = [], []
    for b, piece in enumerate(pieces):
        rows = np.frombuffer(piece.rows, dtype=INDEX_DTYPE)
        parts.append(rows)
        tokens = np.frombuffer(piece.tokens, dtype=np.dtype(piece.token_dtype))
        buffers.append((b, int(rows["token_start"][0]), tokens))
    return marker.task, marker.dedup, pieces, merge_shard_parts(parts, buffers)
