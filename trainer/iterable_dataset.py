"""A torch `IterableDataset` over pileprep shards, for users with their own training loop and `DataLoader`.

(The bundled trainer uses trainer/streams.py's resumable streams, read by trainer/data.py; this is the plain,
familiar interface.)

The work-splitting rule, which makes every example appear at most once per epoch and gives every
data-parallel rank the same number of batches:

* Epoch e's order is the split's shards in an order permuted by (seed, e) — or manifest order with
  `shuffle_shards=False` — each shard's records in file order: N examples, positions 0..N-1.
* With `world_size` ranks and `batch_size` B, every rank gets `per_rank = N // (world_size * B)` batches.
  Rank r owns the contiguous positions [r * per_rank * B, (r + 1) * per_rank * B).
* **Remainder rule:** the last N mod (world_size * B) positions of the epoch order are not used in that
  epoch (fewer than one batch per rank). With shuffled shards a different tail is left out each epoch.
* Inside a rank, DataLoader worker k of K gets a contiguous share of the rank's batches (batch counts differ
  by at most one between workers), and yields whole batches' worth of examples, so `DataLoader(ds,
  batch_size=B, num_workers=K)` makes exactly `per_rank` full batches on every rank, never a partial one.

Records are read through model_contract's TFRecord reader (CRCs verified) from local paths or any Beam
filesystem path (s3://). A worker reads only the shards its positions touch, from the first needed record.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from model_contract import (INPUT_IDS, POSITIONS, SEGMENT_IDS, Manifest, decode_example, load_manifest, manifest_path,
                            resolve_shard_path)
from model_contract.checked_reader import iter_checked_records


def epoch_shard_order(n_shards: int, seed: int, epoch: int, shuffle: bool) -> list:
    if not shuffle:
        return list(range(n_shards))
    return [int(i) for i in np.random.default_rng([seed, epoch, 0x5EED]).permutation(n_shards)]


def split_work(n_examples: int, world_size: int, rank: int, batch_size: int, num_workers: int,
               worker: int) -> tuple:
    """[start, stop) positions of the epoch order that (rank, worker) yields; see the module doc's rule."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    if batch_size < 1 or num_workers < 1 or not 0 <= worker < num_workers:
        raise ValueError(f"batch_size {batch_size} / worker {worker} of {num_workers} is not valid")
    per_rank = n_examples // (world_size * batch_size)
    lo_batch = per_rank * worker // num_workers
    hi_batch = per_rank * (worker + 1) // num_workers
    base = rank * per_rank * batch_size
    return base + lo_batch * batch_size, base + hi_batch * batch_size


def batches_per_rank(n_examples: int, world_size: int, batch_size: int) -> int:
    return n_examples // (world_size * batch_size)


class ShardIterableDataset(IterableDataset):
    """Examples of one split as dicts of int64 tensors: input_ids, segment_ids, positions, and `index` (the
    example's position in the epoch order, for bookkeeping). Call `set_epoch(e)` before each epoch (with
    `persistent_workers=True` the workers keep the epoch they started with: leave it off, the default)."""

    def __init__(self, dataset: str, split: str = "train", *, batch_size: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0, shuffle_shards: bool = True, verify: bool = True):
        self.manifest_file = dataset if dataset.endswith(".json") else manifest_path(dataset)
        manifest = _load(self.manifest_file)
        self.shards = manifest.shards_for(split)
        if not self.shards:
            raise ValueError(f"{self.manifest_file}: no shards for split {split!r}")
        self.split, self.batch_size, self.rank, self.world_size = split, batch_size, rank, world_size
        self.seed, self.shuffle_shards, self.verify = seed, shuffle_shards, verify
        self.epoch = 0
        self.n_examples = sum(s.examples for s in self.shards)
        split_work(self.n_examples, world_size, rank, batch_size, 1, 0)  # validate the arguments now

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        """Examples this rank yields per epoch (all workers together)."""
        return batches_per_rank(self.n_examples, self.world_size, self.batch_size) * self.batch_size

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        start, stop = split_work(self.n_examples, self.world_size, self.rank, self.batch_size, workers, worker)
        order = epoch_shard_order(len(self.shards), self.seed, self.epoch, self.shuffle_shards)
        position = 0
        for shard_idx in order:
            shard = self.shards[shard_idx]
            first, end = position, position + shard.examples
            position = end
            if end <= start or first >= stop:
                continue
            yield from self._read(shard, first, max(start, first), min(stop, end))
            if end >= stop:
                return

    def _read(self, shard, first: int, lo: int, hi: int) -> Iterator[dict]:
        path = resolve_shard_path(self.manifest_file, shard)
        with _open(path) as f:
            for i, record in enumerate(iter_checked_records(f, shard, name=path, verify=self.verify)):
                pos = first + i
                if pos < lo:
                    continue
                if pos >= hi:
                    return
                ex = decode_example(record)
                yield {INPUT_IDS: torch.from_numpy(np.asarray(ex[INPUT_IDS], dtype=np.int64)),
                       SEGMENT_IDS: torch.from_numpy(np.asarray(ex[SEGMENT_IDS], dtype=np.int64)),
                       POSITIONS: torch.from_numpy(np.asarray(ex[POSITIONS], dtype=np.int64)),
                       "index": torch.tensor(pos, dtype=torch.int64)}


def _open(path: str):
    if "://" not in path:
        return open(path, "rb", buffering=1 << 20)
    from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415 - object stores only

    return FileSystems.open(path, compression_type="uncompressed")


def _load(manifest_file: str) -> Manifest:
    if "://" not in manifest_file:
        return load_manifest(manifest_file)
    with _open(manifest_file) as f:
        return Manifest.from_json(f.read().decode("utf-8"))


__all__ = ["ShardIterableDataset", "split_work", "batches_per_rank", "epoch_shard_order"]
