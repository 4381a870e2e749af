"""The data order: which record each position of each global batch gets, as integer arithmetic whose state
a checkpoint stores (the loader, trainer/data.py, reads the records it names).

The data-order rule (what makes resume exact, also with another data-parallel size):

* Epoch e's **global record order** is the manifest's shards of the split in an order permuted by (seed, e),
  each shard's records in file order. Record i of that order belongs to **logical stream** i mod S, where S =
  `DataConfig.streams` is chosen once for the run (default 512) and stored in checkpoints; it is independent
  of the number of processes.
* Each stream shuffles its records with a bounded buffer (`shuffle_buffer` records): its i-th output is buffer
  slot splitmix64(key(seed, e, stream) xor i) mod (buffer fill), swapped out for the last slot.
* Example n of the epoch (n = k * G + j for global batch k, position j) is the (n div S)-th output of stream
  n mod S. Data-parallel rank r of dp trains on positions [r*G/dp, (r+1)*G/dp) of every global batch, so the
  global batches are the same for any dp (and any micro-batching) that divides G.
* Every epoch has floor(S * floor(E/S) / G) steps; what does not fill them is dropped.
* The streams' state is (epoch, per stream: records taken, the buffer as global record indices, records
  emitted). It is the same on every rank — each rank advances all S streams, which is integer arithmetic, and
  reads only the records at its own positions — so a checkpoint stores it once and any dp resumes from it:
  no example of the epoch is skipped or repeated.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from trainer.config import DEFAULT_STREAMS


def default_streams(examples: int) -> int:
    """512 streams, or the largest power of two leaving >= 8 records per stream on a small dataset."""
    s = DEFAULT_STREAMS
    while s > 1 and examples // s < 8:
        s //= 2
    return s


def _rng(*key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(key))))


def shard_order(seed: int, epoch: int, n_shards: int) -> list[int]:
    return [int(i) for i in _rng(seed, epoch, 1 << 20).permutation(n_shards)]


_M64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a bijective 64-bit hash (Steele et al. 2014)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


@dataclass
class StreamState:
    stream: int
    epoch: int
    taken: int = 0  # records of this stream moved into the buffer so far this epoch
    buffer: list[int] = field(default_factory=list)  # global record indices, in buffer order
    emitted: int = 0  # records handed out this epoch; also the index of the next random draw

    def to_dict(self) -> dict:
        return {"stream": self.stream, "epoch": self.epoch, "taken": self.taken, "buffer": list(self.buffer),
                "emitted": self.emitted}

    @classmethod
    def from_dict(cls, d: dict) -> "StreamState":
        return cls(**{**d, "buffer": list(d["buffer"])})  # never share the caller's lists: streams mutate theirs


class Stream:
    """One logical stream: records s, s+S, s+2S, ... of the epoch's global order through a bounded buffer.

    Pure index arithmetic: it yields global record indices; the loader reads only those it trains on. The shuffle's
    random draws are counter-based — draw i of (seed, epoch, stream) is a hash of those and i — so the state is
    three integers and the buffer (a generator's state costs more to snapshot than the whole step's draws)."""

    def __init__(self, n_records: int, n_streams: int, buffer_size: int, seed: int, state: StreamState):
        self.n_streams, self.buffer_size = n_streams, buffer_size
        self.state = state
        self.n_mine = max(0, (n_records - state.stream + n_streams - 1) // n_streams)
        self.key = _mix64(_mix64(_mix64(seed & _M64) ^ state.epoch) ^ state.stream)

    def next(self) -> Optional[int]:
        s = self.state
        while len(s.buffer) < self.buffer_size and s.taken < self.n_mine:
            s.buffer.append(s.stream + self.n_streams * s.taken)
            s.taken += 1
        if not s.buffer:
            return None
        j = _mix64(self.key ^ s.emitted) % len(s.buffer)
        item = s.buffer[j]
        s.buffer[j] = s.buffer[-1]
        s.buffer.pop()
        s.emitted += 1
        return item

    def snapshot(self) -> tuple:
        s = self.state
        return (s.taken, s.buffer.copy(), s.emitted)
