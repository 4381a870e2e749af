"""The loader: this rank's part of every global batch, read from the shards in the order trainer/streams.py
sets, decoded into tensors with labels, prefetched on a thread, and resumable from its state.

The pieces it stands on: which manifest and contract (trainer/dataset.py), the shard files, their integrity and
record-offset index (trainer/shard_files.py), and the data order with its resumable stream state
(trainer/streams.py, where the rule that makes resume exact under another data-parallel size is written).

Labels: the model sees all seq_len tokens; label[t] = input_ids[t+1] when t+1 is in the same document piece
(same non-zero segment id), else IGNORE_INDEX. So no token is predicted across a document boundary or from
padding, and the last position of each example has no target.
"""
from __future__ import annotations

import bisect
import hashlib
import queue
import threading
import time
from typing import Iterator, Optional

import numpy as np
import torch

from model_contract import INPUT_IDS, POSITIONS, SEGMENT_IDS, Manifest, decode_example
from model_contract.tfrecord import read_record_at
from trainer.config import DataConfig
from trainer.model import IGNORE_INDEX
from trainer.shard_files import check_size, shard_offsets, shard_paths
from trainer.streams import Stream, StreamState, default_streams, shard_order


def make_labels(input_ids: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
    labels = np.full_like(input_ids, IGNORE_INDEX)
    same = (segment_ids[..., 1:] == segment_ids[..., :-1]) & (segment_ids[..., :-1] != 0)
    labels[..., :-1] = np.where(same, input_ids[..., 1:], IGNORE_INDEX)
    return labels


# ------------------------------------------------------------------------------------------ loader
class ShardLoader:
    """Yields this rank's part of every global batch as a dict of int64 CPU tensors.

    Keys: input_ids, positions, segment_ids, labels — each [global_batch / dp, seq_len]. With `prefetch`, a
    thread prepares the next batches (pinned when `pin_memory`, for non-blocking copies); `state_dict` always
    describes the batches handed out, not those prepared.
    """

    def __init__(self, manifest: Manifest, manifest_file: str, cfg: DataConfig, seq_len: int, global_batch: int,
                 dp_rank: int = 0, dp_size: int = 1, microbatches: int = 1, index_dir: Optional[str] = None,
                 pin_memory: bool = False, neighbours=None):
        """`neighbours`: a `trainer.retro.AlignedSidecar`; each example then comes with its record's neighbours
        (keys neighbour_tokens [b, chunks, k, r] and neighbour_doc_ids [b, chunks, k])."""
        if global_batch % dp_size:
            raise ValueError(f"global batch {global_batch} does not split over dp = {dp_size} ranks")
        local = global_batch // dp_size
        if local % microbatches:
            raise ValueError(f"per-rank batch {local} (global batch {global_batch} / dp {dp_size}) does not split "
                             f"into {microbatches} micro-batches (--global-batch / --microbatches)")
        shards = manifest.shards_for(cfg.split)
        total = sum(s.examples for s in shards)
        self.n_streams = cfg.streams or default_streams(total)
        self.cfg, self.seq_len, self.global_batch = cfg, seq_len, global_batch
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.positions = range(dp_rank * local, (dp_rank + 1) * local)
        self.pin_memory = pin_memory
        self.neighbours = neighbours
        self.paths = shard_paths(manifest_file, shards)
        self.names = [s.path for s in shards]
        for path, info in zip(self.paths, shards):
            check_size(path, info)
        index_dir = index_dir if index_dir is not None else cfg.index_dir
        self.offsets = [shard_offsets(p, s, index_dir, cfg.verify_crc) for p, s in zip(self.paths, shards)]
        self.counts = [len(o) for o in self.offsets]
        # Loader state points into these shards by global record index: it is only valid for this exact list.
        self.shard_set = hashlib.sha256("\n".join(f"{s.path} {s.sha256}" for s in shards).encode()).hexdigest()
        self.total = total
        self.steps_per_epoch = self.n_streams * (total // self.n_streams) // global_batch
        if self.steps_per_epoch == 0:
            raise ValueError(f"split {cfg.split!r} has {total} examples: fewer than one global batch of "
                             f"{global_batch} over {self.n_streams} streams (lower --global-batch or "
                             f"--data-streams)")
        self._files: dict = {}
        self.read_seconds = self.decode_seconds = 0.0
        self.bytes_read = 0
        self._start_epoch(0)
        self._consumed = self._snapshot()
        self._queue: Optional[queue.Queue] = None
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()

    # -------------------------------------------------------------- epochs and state
    def _start_epoch(self, epoch: int, states: Optional[dict] = None) -> None:
        self._epoch = epoch
        self._step_in_epoch = 0
        order = shard_order(self.cfg.seed, epoch, len(self.paths))
        self.order = order
        self.cum = np.cumsum([self.counts[i] for i in order]).tolist()
        self.streams = [Stream(self.total, self.n_streams, self.cfg.shuffle_buffer, self.cfg.seed,
                               states[s] if states else StreamState(stream=s, epoch=epoch))
                        for s in range(self.n_streams)]

    def _snapshot(self) -> dict:
        return {"epoch": self._epoch, "step_in_epoch": self._step_in_epoch, "streams": self.n_streams,
                "seed": self.cfg.seed, "global_batch": self.global_batch, "shard_set": self.shard_set,
                "stream_states": [s.snapshot() for s in self.streams]}

    @property
    def epoch(self) -> int:
        """Epoch of the last batch handed out."""
        return self._consumed["epoch"]

    @property
    def step_in_epoch(self) -> int:
        return self._consumed["step_in_epoch"]

    def state_dict(self) -> dict:
        """The position after the last batch handed out; the same on every data-parallel rank (JSON-ready)."""
        c = self._consumed
        streams = {str(i): StreamState(i, c["epoch"], taken, list(buf), emitted).to_dict()
                   for i, (taken, buf, emitted) in enumerate(c["stream_states"])}
        return {**c, "stream_states": streams}

    def load_state_dict(self, state: dict) -> None:
        for key, mine, flag in (("streams", self.n_streams, "data-streams"), ("seed", self.cfg.seed, "seed"),
                                ("global_batch", self.global_batch, "global-batch")):
            if state[key] != mine:
                raise ValueError(f"checkpoint's data loader has {key}={state[key]}, this run has {mine}: "
                                 f"resuming would change the data order (keep --{flag} fixed)")
        if state.get("shard_set", self.shard_set) != self.shard_set:
            raise ValueError("the manifest's shard list changed since this checkpoint (e.g. an --incremental run "
                             "committed a new generation): the saved loader positions do not apply to it; resume "
                             "against the dataset the run started with, or start a new run (--no-resume)")
        states = {int(k): StreamState.from_dict(v) for k, v in state["stream_states"].items()}
        missing = [s for s in range(self.n_streams) if s not in states]
        if missing:
            raise ValueError(f"checkpoint lacks loader state for streams {missing[:5]}")
        if self._thread is not None:
            raise RuntimeError("load_state_dict after iteration started")
        self._start_epoch(state["epoch"], states)
        self._step_in_epoch = state["step_in_epoch"]
        self._consumed = self._snapshot()

    # -------------------------------------------------------------- reading
    def _where(self, g: int) -> tuple[int, int]:
        """(shard index, record index in it) of global record g of this epoch's order."""
        pos = bisect.bisect_right(self.cum, g)
        return self.order[pos], g - (self.cum[pos - 1] if pos else 0)

    def _record(self, g: int) -> bytes:
        shard, idx = self._where(g)
        f = self._files.get(shard)
        if f is None:
            if len(self._files) >= 8:
                self._files.pop(next(iter(self._files))).close()
            f = self._files[shard] = open(self.paths[shard], "rb", buffering=0)
        t0 = time.perf_counter()
        data = read_record_at(f, int(self.offsets[shard][idx]), verify=self.cfg.verify_crc, name=self.paths[shard])
        self.read_seconds += time.perf_counter() - t0
        self.bytes_read += len(data) + 16
        return data

    def _produce(self) -> tuple[dict, dict]:
        """The next batch of this rank and the loader state after it."""
        if self._step_in_epoch >= self.steps_per_epoch:  # drop the remainder; next epoch
            self._start_epoch(self._epoch + 1)
        G, S = self.global_batch, self.n_streams
        base = self._step_in_epoch * G
        mine = []
        for j in range(G):
            n = base + j
            g = self.streams[n % S].next()
            if g is None:
                raise RuntimeError(f"stream {n % S} ran out within the epoch: the shards hold fewer records than "
                                   f"the manifest says")
            if j in self.positions:
                mine.append(g)
        records = [self._record(g) for g in mine]
        t0 = time.perf_counter()
        exs = [decode_example(r) for r in records]
        ids_a = np.stack([e[INPUT_IDS] for e in exs])
        seg_a = np.stack([e[SEGMENT_IDS] for e in exs])
        pos_a = np.stack([e[POSITIONS] for e in exs])
        if ids_a.shape[1] != self.seq_len:
            raise ValueError(f"example of length {ids_a.shape[1]}, expected seq_len {self.seq_len}")
        batch = {"input_ids": torch.from_numpy(ids_a), "positions": torch.from_numpy(pos_a),
                 "segment_ids": torch.from_numpy(seg_a), "labels": torch.from_numpy(make_labels(ids_a, seg_a))}
        if self.neighbours is not None:  # the sidecar record at the same shard and record index
            nbs = [self.neighbours.get(self.names[sh], idx) for sh, idx in map(self._where, mine)]
            for key in ("neighbour_tokens", "neighbour_doc_ids"):
                batch[key] = torch.from_numpy(np.stack([nb[key] for nb in nbs]))
        if self.pin_memory:
            batch = {k: v.pin_memory() for k, v in batch.items()}
        self.decode_seconds += time.perf_counter() - t0
        self._step_in_epoch += 1
        return batch, self._snapshot()

    def _worker(self) -> None:
        try:
            while not self._stop.is_set():
                item = self._produce()
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as e:  # handed to the consumer, raised there
            self._queue.put(e)

    # -------------------------------------------------------------- batches
    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        if self.cfg.prefetch <= 0:
            batch, self._consumed = self._produce()
            return batch
        if self._thread is None:
            self._queue = queue.Queue(maxsize=self.cfg.prefetch)
            self._thread = threading.Thread(target=self._worker, name="shard-loader", daemon=True)
            self._thread.start()
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        batch, self._consumed = item
        return batch

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for f in self._files.values():
            f.close()
        self._files.clear()
        if self.neighbours is not None:
            self.neighbours.close()
