"""Reading pileprep shards for training: contract check, shard integrity, deterministic streams, resumable.

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

Records are located through a **record-offset index** per shard (walked once and cached, see `shard_offsets`),
so each record is read exactly once, by seeking: no stream walks the headers of records it does not own.

Integrity: every shard's size and record count are checked against the manifest when the loader opens it
(model_contract/checked_reader.py, the check every reader of shards makes); with `verify_data`, its sha256 too
(`prepare_shards`, once per shard per node). Shard paths must stay inside the dataset directory
(`model_contract.resolve_shard_path`). The contract sizes the model (embedding rows, positions): before anything
is allocated, `open_dataset` refuses a contract beyond `MAX_VOCAB` / `MAX_SEQ_LEN` and one that the first record
of the split contradicts (its length is not seq_len, or it holds an id >= the vocabulary).

Labels: the model sees all seq_len tokens; label[t] = input_ids[t+1] when t+1 is in the same document piece
(same non-zero segment id), else IGNORE_INDEX. So no token is predicted across a document boundary or from
padding, and the last position of each example has no target.
"""
from __future__ import annotations

import bisect
import hashlib
import os
import queue
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional

import numpy as np
import torch

from model_contract import (INPUT_IDS, POSITIONS, SEGMENT_IDS, Expectation, Manifest, ShardInfo, check_compatible,
                            decode_example, load_manifest, manifest_path, resolve_shard_path)
from model_contract import hashing, refs
from model_contract.checked_reader import ShardMismatchError, count_problem, iter_checked_records, size_problem
from model_contract.tfrecord import read_record_at, record_offsets
from trainer.config import DEFAULT_STREAMS, DataConfig, ModelConfig
from trainer.model import IGNORE_INDEX


class DataIntegrityError(ValueError):
    """A shard that does not match its manifest entry (size, record count, sha256) or lies outside the dataset."""


# ------------------------------------------------------------------------------------------ contract
def tokenizer_pin(value: Optional[str]) -> Optional[str]:
    """--tokenizer: a sha256 as given, or the sha256 of the tokenizer file it names (any format: SentencePiece
    .model, tiktoken file, tokenizer.json, or a directory holding one, as transforms/tokenize/tokenizer.py reads)."""
    if not value:
        return None
    if len(value) == 64 and all(c in "0123456789abcdef" for c in value.lower()):
        return value.lower()
    if os.path.isdir(value):
        value = os.path.join(value, "tokenizer.json")
    if not os.path.isfile(value):
        raise ValueError(f"--tokenizer {value}: neither a file nor a sha256")
    with open(value, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_manifest(cfg: DataConfig, generation: Optional[str] = None) -> tuple[Manifest, str]:
    """The manifest of `generation` (the one this run pinned, `pin_generation`; None: the live one): the live
    manifest while it is still that generation, else the generation's own copy that commits keep beside it
    (model_contract/refs.py), or FileNotFoundError naming the generation. Shards resolve from `mfile`, the
    dataset's manifest.json, either way."""
    mfile = manifest_path(cfg.path) if not cfg.path.endswith(".json") else cfg.path
    manifest = load_manifest(mfile)
    if generation is not None and manifest.generation != generation:
        manifest = refs.load_generation_manifest(refs.dataset_dir_of(cfg.path), generation)
    return manifest, mfile


def pin_generation(cfg: DataConfig, checkpoint_dir: Optional[str], resumed: Optional[str]) -> Optional[str]:
    """The generation this run reads for its whole life: the checkpoint's on a resume (refused, naming it, when
    the dataset no longer keeps it), else the live one. Rank 0 registers the run's ref (holder: the checkpoint
    directory) so no commit or `pileprep gc` removes the generation while its checkpoints need it; a run
    without --checkpoint-dir relies on the previous generation being kept (--keep-generations)."""
    dataset = refs.dataset_dir_of(cfg.path)
    holder = os.path.abspath(checkpoint_dir) if checkpoint_dir and int(os.environ.get("RANK", "0")) == 0 else None
    if resumed is None:
        if refs.live_generation(dataset) is None:
            return None  # a manifest written before generations were named
        return refs.pin_generation(dataset, holder) if holder else refs.live_generation(dataset)
    generation = refs.check_generation_name(resumed, "checkpoint meta.json generation")

    def check_kept() -> None:
        if refs.live_generation(dataset) != generation:
            refs.load_generation_manifest(dataset, generation)  # FileNotFoundError naming it when gone

    check_kept()
    if holder:
        refs.write_ref_local(dataset, refs.Ref(generation, "trainer", holder, round(time.time(), 3)))
        check_kept()  # a gc between the first check and the ref removed it: refuse now, not mid-run
    return generation


def check_same_generation(generation: Optional[str]) -> None:
    """After the rendezvous: every rank read the live manifest on its own, so a commit landing between two ranks'
    reads would give them different shard lists. Refuse, naming both, rather than train on a mix."""
    import torch.distributed as dist  # noqa: PLC0415

    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, generation)
    if len(set(gathered)) > 1:
        raise RuntimeError(f"ranks started on different generations ({', '.join(sorted(set(map(str, gathered))))}): "
                           f"a commit landed while they started; start the run again")


def open_dataset(cfg: DataConfig, model: ModelConfig, generation: Optional[str] = None) -> tuple[Manifest, str]:
    """Load the manifest (of `generation`, read_manifest) and check it against the model config; call before any
    process-group work.

    Raises ContractMismatchError listing every difference (seq_len, vocab, features, pinned tokenizer).
    """
    manifest, mfile = read_manifest(cfg, generation)
    check_contract_limits(manifest, mfile)
    check_compatible(manifest, Expectation(seq_len=model.seq_len, vocab_size=model.vocab_size,
                                           tokenizer_sha256=tokenizer_pin(cfg.tokenizer)))
    if not manifest.shards_for(cfg.split):
        raise ValueError(f"{mfile}: no shards for split {cfg.split!r} (--split)")
    check_first_record(manifest, mfile, cfg.split)
    return manifest, mfile


# The largest contract the trainer builds a model for. The model's embedding has vocab_size rows and its position
# table and attention masks grow with seq_len (trainer/model.py, costed in trainer/plan.py): a hand-edited
# `vocab_size` of 2e9 or `seq_len` of 1e8 would end in an allocation traceback, not a message. 2**24 ids is 64x
# the largest tokenizers in use (256k); 2**20 tokens per sequence is 8x the longest-context recipes.
MAX_VOCAB = 1 << 24
MAX_SEQ_LEN = 1 << 20


def check_contract_limits(manifest: Manifest, mfile: str) -> None:
    """Refuse (DataIntegrityError, one line) a contract whose sizes no model of this trainer can be built for."""
    c = manifest.contract
    for name, value, limit in (("seq_len", c.seq_len, MAX_SEQ_LEN), ("tokenizer.vocab_size",
                                                                     c.tokenizer.vocab_size, MAX_VOCAB)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= limit:
            raise DataIntegrityError(f"{mfile}: contract {name} {value!r} is outside 1..{limit}: a damaged or "
                                     f"hand-edited manifest; refusing before the model is built")


def check_first_record(manifest: Manifest, mfile: str, split: str) -> None:
    """The contract against the data itself: the split's first record must be seq_len tokens, every id below
    the vocabulary (a contract that lies about either would size the model wrongly or index past its
    embedding). Reads one record, through the checked reader (the shard's size is checked first)."""
    c = manifest.contract
    info = manifest.shards_for(split)[0]
    if info.examples == 0:
        return
    path = shard_paths(mfile, [info])[0]
    try:
        with open(path, "rb") as f:
            record = next(iter_checked_records(f, info, name=path), None)
    except ShardMismatchError as e:
        raise DataIntegrityError(str(e)) from None
    except OSError as e:
        raise DataIntegrityError(f"shard {info.path}: cannot open ({e.strerror})") from None
    if record is None:
        raise DataIntegrityError(count_problem(info, 0))
    ids = decode_example(record)[INPUT_IDS]
    if len(ids) != c.seq_len:
        raise DataIntegrityError(f"shard {info.path}: record 0 has {len(ids)} tokens, the contract's seq_len is "
                                 f"{c.seq_len}: a damaged or hand-edited manifest; refusing before the model is built")
    if len(ids) and (int(ids.max()) >= c.tokenizer.vocab_size or int(ids.min()) < 0):
        raise DataIntegrityError(f"shard {info.path}: record 0 holds token id {int(ids.max())}, outside the "
                                 f"contract's vocab_size {c.tokenizer.vocab_size}: a damaged or hand-edited "
                                 f"manifest; refusing before the model is built")


def default_streams(examples: int) -> int:
    """512 streams, or the largest power of two leaving >= 8 records per stream on a small dataset."""
    s = DEFAULT_STREAMS
    while s > 1 and examples // s < 8:
        s //= 2
    return s


# ------------------------------------------------------------------------------------------ shard index
def shard_paths(manifest_file: str, shards: list) -> list:
    """Local paths of the shards; a path outside the dataset directory (absolute, `..`, a symlink out) is refused:
    a manifest must not make the trainer read arbitrary files."""
    root = os.path.realpath(os.path.dirname(os.path.abspath(manifest_file)))
    out = []
    for s in shards:
        try:
            path = resolve_shard_path(manifest_file, s)  # the contract's own containment check
        except ValueError as e:
            raise DataIntegrityError(f"shard {s.path!r}: {e}") from None
        if os.path.isabs(s.path) or os.path.commonpath([root, os.path.realpath(path)]) != root:
            raise DataIntegrityError(f"shard {s.path!r}: outside the dataset directory {root}: refused")
        out.append(path)
    return out


def check_size(path: str, info: ShardInfo) -> None:
    """Always, on open: a missing, cut or replaced shard is refused before training, naming it."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        raise DataIntegrityError(f"shard {info.path}: cannot open ({e.strerror})") from None
    if size_problem(info, size):
        raise DataIntegrityError(size_problem(info, size))


def sha256_file(path: str) -> str:
    return hashing.sha256_file(path)[1]  # the producer's hash (model_contract/hashing.py)


def default_index_dir(checkpoint_dir: Optional[str]) -> str:
    if checkpoint_dir:
        return os.path.join(checkpoint_dir, "offsets")
    return os.path.join(tempfile.gettempdir(), f"pileprep-offsets-{os.getuid()}")


def _index_file(index_dir: str, info: ShardInfo, path: str) -> str:
    # The file's own identity too, not only the manifest's claim about it: keyed by the manifest alone, a file
    # cut or replaced after its offsets were cached would be read through the intact file's offsets.
    st = os.stat(path)
    return os.path.join(index_dir, f"{info.sha256}-{info.bytes}-{st.st_size}-{st.st_ino}-{st.st_mtime_ns}"
                                   f".offsets.npy")


def shard_offsets(path: str, info: ShardInfo, index_dir: Optional[str], verify: bool = True) -> np.ndarray:
    """Byte offset of every record of a shard: read from the cache beside the run, or walked once and cached.

    The cache is keyed by the manifest's sha256 and size of the shard and by the file's size, inode and mtime
    (`_index_file`), written with temp name + rename.
    """
    cached = _index_file(index_dir, info, path) if index_dir else None
    offsets = None
    if cached and os.path.exists(cached):
        try:
            offsets = np.load(cached)
        except (OSError, ValueError):
            offsets = None
    if offsets is None:
        with open(path, "rb", buffering=1 << 16) as f:
            offsets = np.asarray(record_offsets(f, verify=verify, name=path), dtype=np.int64)
        if cached:
            os.makedirs(index_dir, exist_ok=True)
            tmp = f"{cached}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                np.save(f, offsets)
            os.replace(tmp, cached)
    if count_problem(info, len(offsets)):
        raise DataIntegrityError(count_problem(info, len(offsets)))
    return offsets


def prepare_shards(manifest: Manifest, manifest_file: str, cfg: DataConfig, index_dir: str, local_rank: int = 0,
                   local_world: int = 1) -> list:
    """This node's share of the per-shard work, before training: shard i is checked by local rank
    i mod local_world (once per node, not per rank). Size always; offsets index built and cached; sha256 with
    verify_data. Returns the error messages (empty when every shard of this rank's share is intact)."""
    shards = manifest.shards_for(cfg.split)
    errors = []
    for i, (path, info) in enumerate(zip(shard_paths(manifest_file, shards), shards)):
        if i % local_world != local_rank:
            continue
        try:
            check_size(path, info)
            if cfg.verify_data:
                digest = sha256_file(path)
                if digest != info.sha256:
                    raise DataIntegrityError(f"shard {info.path}: sha256 {digest[:12]}…, the manifest says "
                                             f"{info.sha256[:12]}… (replaced or damaged)")
            shard_offsets(path, info, index_dir, cfg.verify_crc)
        except (DataIntegrityError, ValueError) as e:
            errors.append(str(e))
    return errors


# ------------------------------------------------------------------------------------------ order
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
    buffer: list = field(default_factory=list)  # global record indices, in buffer order
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


def merge_states(states: list) -> dict:
    """Loader states of several ranks (identical by construction) as one run-wide state."""
    for st in states[1:]:
        if (st["epoch"], st["step_in_epoch"]) != (states[0]["epoch"], states[0]["step_in_epoch"]):
            raise RuntimeError("data-parallel ranks disagree on the loader position")
    return states[0]
