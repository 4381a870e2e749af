"""Reading pileprep shards for training: contract check, deterministic streams, bounded shuffle, resumable.

The data-order rule (what makes resume exact, also with another data-parallel size):

* Epoch e's **global record order** is the manifest's train shards in an order permuted by (seed, e), each
  shard's records in file order. Record i of that order belongs to **logical stream** i mod S, where S =
  `DataConfig.streams` is fixed for the run (default 8) and independent of the number of processes.
* Each stream shuffles its records with a bounded buffer (`shuffle_buffer` records) driven by a numpy PCG64
  generator seeded by (seed, e, stream) — for S = dp this is "seeded by (seed, epoch, dp_rank)".
* Global batch k of the epoch is the concatenation, in stream order, of the k-th block of G/S examples of
  every stream. Data-parallel rank r of dp owns streams [r*S/dp, (r+1)*S/dp): its slice of the global batch
  is contiguous, so the union of all ranks' batches is the same global batch for any dp that divides S.
* Every epoch has floor(floor(E/S) / (G/S)) steps; what does not fill a global batch is dropped, so every
  global batch splits evenly over ranks and micro-batches.
* A stream's state is (epoch, position in the global order, byte offset in the current shard, the buffer as
  (shard, byte offset) locators, generator state). A checkpoint stores all S stream states; a resumed run,
  whatever its dp, restores the streams it owns, re-reads the buffered records by seeking to their offsets,
  and continues: no example of the epoch is skipped or repeated, and the global batches are identical.

Labels: the model sees all seq_len tokens; label[t] = input_ids[t+1] when t+1 is in the same document piece
(same non-zero segment id), else IGNORE_INDEX. So no token is predicted across a document boundary or from
padding, and the last position of each example has no target.
"""
from __future__ import annotations

import hashlib

import io
import struct
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np
import torch

from model_contract import (INPUT_IDS, POSITIONS, SEGMENT_IDS, Expectation, Manifest, TFRecordCorruptError,
                            check_compatible, decode_example, load_manifest, manifest_path, resolve_shard_path)
from model_contract.tfrecord import masked_crc32c
from trainer.config import DataConfig, ModelConfig
from trainer.model import IGNORE_INDEX

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


# ------------------------------------------------------------------------------------------ contract
def open_dataset(cfg: DataConfig, model: ModelConfig) -> tuple[Manifest, str]:
    """Load the manifest and check it against the model config; call before any process-group work.

    Raises ContractMismatchError listing every difference (seq_len, vocab, features).
    """
    mfile = manifest_path(cfg.path) if not cfg.path.endswith(".json") else cfg.path
    manifest = load_manifest(mfile)
    check_compatible(manifest, Expectation(seq_len=model.seq_len, vocab_size=model.vocab_size))
    if not manifest.shards_for(cfg.split):
        raise ValueError(f"{mfile}: no shards for split {cfg.split!r} (--split)")
    return manifest, mfile


# ------------------------------------------------------------------------------------------ records
class ShardFiles:
    """Random-access TFRecord reading with framing and CRC verification; counts read time and bytes."""

    def __init__(self, paths: list[str], verify: bool = True):
        self.paths, self.verify = paths, verify
        self._open: dict[int, io.BufferedReader] = {}
        self.read_seconds = 0.0
        self.bytes_read = 0

    def _file(self, shard: int):
        f = self._open.get(shard)
        if f is None:
            if len(self._open) >= 4:  # a stream touches one shard at a time; resume touches a few more
                self._open.pop(next(iter(self._open))).close()
            f = self._open[shard] = open(self.paths[shard], "rb", buffering=1 << 20)
        return f

    def header(self, shard: int, offset: int) -> Optional[int]:
        """Length of the record at offset, or None at end of file."""
        t0 = time.perf_counter()
        f = self._file(shard)
        f.seek(offset)
        head = f.read(12)
        self.read_seconds += time.perf_counter() - t0
        if not head:
            return None
        name = f"{self.paths[shard]}@{offset}"
        if len(head) < 12:
            raise TFRecordCorruptError(f"{name}: truncated record header")
        if self.verify and _U32.unpack(head[8:])[0] != masked_crc32c(head[:8]):
            raise TFRecordCorruptError(f"{name}: record length checksum mismatch")
        return _U64.unpack(head[:8])[0]

    def payload(self, shard: int, offset: int, length: int) -> bytes:
        t0 = time.perf_counter()
        f = self._file(shard)
        f.seek(offset + 12)
        body = f.read(length + 4)
        if len(body) < length + 4:
            raise TFRecordCorruptError(f"{self.paths[shard]}@{offset}: truncated record")
        data = body[:length]
        if self.verify and _U32.unpack(body[length:])[0] != masked_crc32c(data):
            raise TFRecordCorruptError(f"{self.paths[shard]}@{offset}: record data checksum mismatch")
        self.read_seconds += time.perf_counter() - t0
        self.bytes_read += length + 16
        return data

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()


def _rng(*key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(list(key))))


def shard_order(seed: int, epoch: int, n_shards: int) -> list[int]:
    return [int(i) for i in _rng(seed, epoch, 1 << 20).permutation(n_shards)]


@dataclass
class StreamState:
    stream: int
    epoch: int
    order_pos: int = 0  # index into the epoch's shard order
    offset: int = 0  # byte offset of the next record in that shard
    global_index: int = 0  # index of that record in the epoch's global order
    buffer: list = field(default_factory=list)  # [(shard, offset)] in buffer order
    rng: Optional[dict] = None  # numpy bit generator state
    emitted: int = 0

    def to_dict(self) -> dict:
        return {"stream": self.stream, "epoch": self.epoch, "order_pos": self.order_pos, "offset": self.offset,
                "global_index": self.global_index, "buffer": [list(b) for b in self.buffer],
                "rng": _json_rng(self.rng), "emitted": self.emitted}

    @classmethod
    def from_dict(cls, d: dict) -> "StreamState":
        s = cls(**{**d, "buffer": [tuple(b) for b in d["buffer"]]})
        s.rng = _unjson_rng(s.rng)
        return s


def _json_rng(state):
    if state is None:
        return None
    return {"bit_generator": state["bit_generator"], "has_uint32": int(state["has_uint32"]),
            "uinteger": int(state["uinteger"]),
            "state": {"state": str(state["state"]["state"]), "inc": str(state["state"]["inc"])}}


def _unjson_rng(state):
    if state is None:
        return None
    return {**state, "state": {"state": int(state["state"]["state"]), "inc": int(state["state"]["inc"])}}


class Stream:
    """One logical stream: strided records of the epoch's global order through a bounded shuffle buffer."""

    def __init__(self, files: ShardFiles, n_streams: int, buffer_size: int, seed: int, state: StreamState):
        self.files, self.n_streams, self.buffer_size, self.seed = files, n_streams, buffer_size, seed
        self.state = state
        self.order = shard_order(seed, state.epoch, len(files.paths))
        self.rng = _rng(seed, state.epoch, state.stream)
        if state.rng is not None:
            self.rng.bit_generator.state = state.rng
        # Re-read buffered records from their locators (exact resume without storing payloads).
        self.buffer = [(loc, files.payload(loc[0], loc[1], files.header(loc[0], loc[1]))) for loc in state.buffer]

    def _next_source(self):
        """The next record of this stream from the global order, or None at the end of the epoch."""
        s = self.state
        while s.order_pos < len(self.order):
            shard = self.order[s.order_pos]
            length = self.files.header(shard, s.offset)
            if length is None:
                s.order_pos += 1
                s.offset = 0
                continue
            offset = s.offset
            mine = s.global_index % self.n_streams == s.stream
            s.offset += length + 16
            s.global_index += 1
            if mine:
                return (shard, offset), self.files.payload(shard, offset, length)
        return None

    def next(self) -> Optional[bytes]:
        while len(self.buffer) < self.buffer_size:
            item = self._next_source()
            if item is None:
                break
            self.buffer.append(item)
        if not self.buffer:
            return None
        j = int(self.rng.integers(len(self.buffer)))
        item = self.buffer[j]
        self.buffer[j] = self.buffer[-1]
        self.buffer.pop()
        self.state.emitted += 1
        return item[1]

    def snapshot(self) -> StreamState:
        s = self.state
        return StreamState(s.stream, s.epoch, s.order_pos, s.offset, s.global_index,
                           [loc for loc, _ in self.buffer], self.rng.bit_generator.state, s.emitted)


def make_labels(input_ids: np.ndarray, segment_ids: np.ndarray) -> np.ndarray:
    labels = np.full_like(input_ids, IGNORE_INDEX)
    same = (segment_ids[..., 1:] == segment_ids[..., :-1]) & (segment_ids[..., :-1] != 0)
    labels[..., :-1] = np.where(same, input_ids[..., 1:], IGNORE_INDEX)
    return labels


class ShardLoader:
    """Yields this rank's part of every global batch as a dict of int64 CPU tensors.

    Keys: input_ids, positions, segment_ids, labels — each [global_batch / dp, seq_len].
    """

    def __init__(self, manifest: Manifest, manifest_file: str, cfg: DataConfig, seq_len: int, global_batch: int,
                 dp_rank: int = 0, dp_size: int = 1, microbatches: int = 1):
        S = cfg.streams
        if S % dp_size:
            raise ValueError(f"data-parallel size {dp_size} must divide the number of data streams {S} "
                             f"(--data-streams); streams are the unit of elastic resume")
        if global_batch % S:
            raise ValueError(f"global batch {global_batch} must be a multiple of --data-streams {S}")
        local = global_batch // dp_size
        if local % microbatches:
            raise ValueError(f"per-rank batch {local} (global batch {global_batch} / dp {dp_size}) does not split "
                             f"into {microbatches} micro-batches (--global-batch / --microbatches)")
        self.cfg, self.seq_len, self.global_batch = cfg, seq_len, global_batch
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.per_stream = global_batch // S
        self.my_streams = list(range(dp_rank * S // dp_size, (dp_rank + 1) * S // dp_size))
        shards = manifest.shards_for(cfg.split)
        self.files = ShardFiles([resolve_shard_path(manifest_file, s) for s in shards], verify=cfg.verify_crc)
        # Loader state points into these shards by index and byte offset: it is only valid for this exact list.
        self.shard_set = hashlib.sha256("\n".join(f"{s.path} {s.sha256}" for s in shards).encode()).hexdigest()
        total = sum(s.examples for s in shards)
        self.steps_per_epoch = (total // S) // self.per_stream
        if self.steps_per_epoch == 0:
            raise ValueError(f"split {cfg.split!r} has {total} examples: fewer than one global batch of "
                             f"{global_batch} (lower --global-batch)")
        self.epoch, self.step_in_epoch = 0, 0
        self.decode_seconds = 0.0
        self._start_epoch(0)

    # -------------------------------------------------------------- epochs and state
    def _start_epoch(self, epoch: int, states: Optional[dict] = None) -> None:
        self.epoch = epoch
        self.streams = {}
        for s in self.my_streams:
            st = states[s] if states else StreamState(stream=s, epoch=epoch)
            self.streams[s] = Stream(self.files, self.cfg.streams, self.cfg.shuffle_buffer, self.cfg.seed, st)

    def state_dict(self) -> dict:
        """This rank's streams; merge all ranks' with `merge_states` to get a dp-independent state."""
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "streams": self.cfg.streams,
                "seed": self.cfg.seed, "global_batch": self.global_batch, "shard_set": self.shard_set,
                "stream_states": {str(s): st.snapshot().to_dict() for s, st in self.streams.items()}}

    def load_state_dict(self, state: dict) -> None:
        for key, mine in (("streams", self.cfg.streams), ("seed", self.cfg.seed), ("global_batch", self.global_batch)):
            if state[key] != mine:
                raise ValueError(f"checkpoint's data loader has {key}={state[key]}, this run has {mine}: "
                                 f"resuming would change the data order (keep --{key.replace('_', '-')} fixed)")
        if state.get("shard_set", self.shard_set) != self.shard_set:
            raise ValueError("the manifest's shard list changed since this checkpoint (e.g. an --incremental run "
                             "committed a new generation): the saved loader positions do not apply to it; resume "
                             "against the dataset the run started with, or start a new run (--no-resume)")
        states = {int(k): StreamState.from_dict(v) for k, v in state["stream_states"].items()}
        missing = [s for s in self.my_streams if s not in states]
        if missing:
            raise ValueError(f"checkpoint lacks loader state for streams {missing}")
        self.step_in_epoch = state["step_in_epoch"]
        self._start_epoch(state["epoch"], states)

    # -------------------------------------------------------------- batches
    def __iter__(self) -> Iterator[dict]:
        return self

    def __next__(self) -> dict:
        if self.step_in_epoch >= self.steps_per_epoch:  # drop the remainder; next epoch
            self.step_in_epoch = 0
            self._start_epoch(self.epoch + 1)
        ids, seg, pos = [], [], []
        for s in self.my_streams:
            stream = self.streams[s]
            for _ in range(self.per_stream):
                rec = stream.next()
                if rec is None:
                    raise RuntimeError(f"stream {s} ran out within the epoch: the manifest's example counts "
                                       f"do not match the shards")
                t0 = time.perf_counter()
                ex = decode_example(rec)
                self.decode_seconds += time.perf_counter() - t0
                ids.append(ex[INPUT_IDS])
                seg.append(ex[SEGMENT_IDS])
                pos.append(ex[POSITIONS])
        t0 = time.perf_counter()
        ids_a, seg_a, pos_a = np.stack(ids), np.stack(seg), np.stack(pos)
        if ids_a.shape[1] != self.seq_len:
            raise ValueError(f"example of length {ids_a.shape[1]}, expected seq_len {self.seq_len}")
        batch = {"input_ids": torch.from_numpy(ids_a), "positions": torch.from_numpy(pos_a),
                 "segment_ids": torch.from_numpy(seg_a), "labels": torch.from_numpy(make_labels(ids_a, seg_a))}
        self.decode_seconds += time.perf_counter() - t0
        self.step_in_epoch += 1
        return batch

    @property
    def read_seconds(self) -> float:
        return self.files.read_seconds

    def close(self) -> None:
        self.files.close()


def merge_states(states: list) -> dict:
    """Combine per-rank loader states (from all_gather_object) into one run-wide state."""
    merged = dict(states[0])
    merged["stream_states"] = {}
    for st in states:
        if (st["epoch"], st["step_in_epoch"]) != (states[0]["epoch"], states[0]["step_in_epoch"]):
            raise RuntimeError("data-parallel ranks disagree on the loader position")
        merged["stream_states"].update(st["stream_states"])
    return merged
