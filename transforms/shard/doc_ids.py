"""Sorted document-id files: what lets dedup see every document without holding every id in memory.

Exact duplicates are removed by document id (a hash of the text, transforms/shard/documents.py). Two places need to
ask "is this id already taken?" about many more ids than one worker should hold:

- across splits inside one run: the packer of a train shard skips documents whose id also sits in val or test
  (held-out copies win). The held-out ids are few (val/test inputs and the hash fractions), so they are one
  sorted array per split, written once by a global pass over the tokenized units (`write_sorted_ids`);
- across generations (`--incremental`): every committed generation writes an *id index* beside its shards —
  all ids it holds, sorted — and a new run looks each of its documents up there (`IdIndex.contains`), so an
  incremental dataset holds exactly the documents a full build of the same inputs would.

Id index layout (little-endian u64 throughout): magic, count n, block size B, fence count f; the n sorted
unique ids; the fence (every B-th id, f values; last, so the index is written in one pass). A lookup reads the
header and fence once (8 bytes per B ids, so ~1.6 MB per 200 M documents), then one ranged read of at most B ids
per distinct block a query touches; memory stays bounded by the fence plus one block whatever the corpus size,
and S3 paths work through ranged reads.
"""
from __future__ import annotations

import struct
from typing import BinaryIO, Iterable

import numpy as np

from transforms.io import io_utils

ID_DTYPE = np.dtype("<u8")
INDEX_MAGIC = b"PPIDX001"
_HEADER = struct.Struct("<8sQQQ")
FENCE_EVERY = 1024
MERGE_BLOCK = 1 << 18  # ids read per input per step of the k-way merge (2 MiB each)


def sorted_unique(ids: np.ndarray) -> np.ndarray:
    """Sort + drop repeats (numpy's own `unique` hashes first, ~30x slower on u64 ids)."""
    a = np.sort(np.asarray(ids, dtype=ID_DTYPE))
    if a.size < 2:
        return a
    keep = np.empty(a.size, dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def write_sorted_ids(stream: BinaryIO, ids: np.ndarray) -> None:
    """A plain sorted unique id array (small per-shard or per-split lists)."""
    stream.write(sorted_unique(ids).tobytes())


def read_sorted_ids(path: str) -> np.ndarray:
    return np.frombuffer(io_utils.read_bytes(path), dtype=ID_DTYPE)


def member_of_sorted(query: np.ndarray, sorted_ids: np.ndarray) -> np.ndarray:
    """Boolean mask: which of `query` occur in the sorted array `sorted_ids` (vectorized binary search)."""
    query = np.asarray(query, dtype=ID_DTYPE)
    if sorted_ids.size == 0 or query.size == 0:
        return np.zeros(query.size, dtype=bool)
    pos = np.searchsorted(sorted_ids, query)
    pos[pos == sorted_ids.size] = 0
    return sorted_ids[pos] == query


def _iter_blocks(path: str, block: int) -> Iterable[np.ndarray]:
    with io_utils.open_read(path) as f:
        while True:
            data = f.read(block * ID_DTYPE.itemsize)
            if not data:
                return
            if len(data) % ID_DTYPE.itemsize:
                raise IOError(f"{path}: id file cut inside an id")
            yield np.frombuffer(data, dtype=ID_DTYPE)


def merge_sorted_files(paths: list, block: int = MERGE_BLOCK) -> Iterable[np.ndarray]:
    """K-way merge of sorted unique id files into sorted unique batches, reading `block` ids per file at a time.

    Each step emits every buffered id up to the smallest "last buffered id" among files still being read: no
    file can later produce a smaller one, so the output is sorted while memory stays at k blocks."""
    iters = [_iter_blocks(p, block) for p in paths]
    bufs = [next(it, None) for it in iters]
    last = None
    while True:
        live = [i for i, b in enumerate(bufs) if b is not None]
        if not live:
            return
        bound = min(int(bufs[i][-1]) for i in live)
        taken = []
        for i in live:
            cut = int(np.searchsorted(bufs[i], np.uint64(bound), side="right"))
            taken.append(bufs[i][:cut])
            rest = bufs[i][cut:]
            bufs[i] = rest if rest.size else next(iters[i], None)
        out = sorted_unique(np.concatenate(taken))
        if last is not None and out.size and out[0] == last:
            out = out[1:]
        if out.size:
            last = out[-1]
            yield out


def write_index(path: str, batches: Iterable[np.ndarray], n: int, fence_every: int = FENCE_EVERY) -> tuple:
    """Write an id index of `n` ids from sorted unique batches in one pass; returns (documents, bytes, sha256).

    The count is known up front (the packers' kept documents), so the header goes first, the fence — collected
    while the ids stream through — last."""
    fence = []
    written = 0
    with io_utils.open_write(path) as raw, io_utils.HashingWriter(raw) as out:
        out.write(_HEADER.pack(INDEX_MAGIC, n, fence_every, -(-n // fence_every)))
        for batch in batches:
            first = (-written) % fence_every  # index inside `batch` of the next fence entry
            fence.append(batch[first::fence_every].copy())
            out.write(batch.tobytes())
            written += batch.size
        if written != n:
            raise IOError(f"{path}: {written} ids merged, {n} expected (a shard's id file is damaged)")
        out.write((np.concatenate(fence) if fence else np.zeros(0, ID_DTYPE)).astype(ID_DTYPE).tobytes())
    return n, out.bytes, out.sha256


class IdIndex:
    """Lookups in one generation's id index: header + fence in memory, one ranged read per touched block."""

    def __init__(self, path: str):
        self.path = path
        with io_utils.open_read(path) as f:
            head = f.read(_HEADER.size)
            if len(head) != _HEADER.size:
                raise IOError(f"{path}: not a document id index (cut short)")
            magic, self.n, self.block, n_fence = _HEADER.unpack(head)
            if magic != INDEX_MAGIC or self.block < 1 or n_fence != -(-self.n // self.block):
                raise IOError(f"{path}: not a document id index (bad header)")
            self._ids_at = _HEADER.size
            f.seek(self._ids_at + self.n * ID_DTYPE.itemsize)
            self.fence = np.frombuffer(f.read(n_fence * ID_DTYPE.itemsize), dtype=ID_DTYPE)
        if self.fence.size != n_fence:
            raise IOError(f"{path}: document id index cut short in its fence")

    def contains(self, query: np.ndarray) -> np.ndarray:
        """Boolean mask over `query` (any order): which ids this generation already holds.

        Queries are grouped by fence block, so each touched block is read once (at most `block` ids), however
        many queries fall into it."""
        query = np.asarray(query, dtype=ID_DTYPE)
        hit = np.zeros(query.size, dtype=bool)
        if self.n == 0 or query.size == 0:
            return hit
        blocks = np.searchsorted(self.fence, query, side="right").astype(np.int64) - 1
        order = np.argsort(blocks, kind="stable")
        order = order[blocks[order] >= 0]  # below the first id: not held
        if order.size == 0:
            return hit
        sorted_blocks = blocks[order]
        starts = np.flatnonzero(np.diff(sorted_blocks, prepend=-1))
        ends = np.append(starts[1:], sorted_blocks.size)
        with io_utils.open_read(self.path) as f:
            for a, b in zip(starts.tolist(), ends.tolist()):
                start = int(sorted_blocks[a]) * self.block
                count = min(self.block, self.n - start)
                f.seek(self._ids_at + start * ID_DTYPE.itemsize)
                data = f.read(count * ID_DTYPE.itemsize)
                if len(data) != count * ID_DTYPE.itemsize:
                    raise IOError(f"{self.path}: document id index cut short")
                sel = order[a:b]
                hit[sel] = member_of_sorted(query[sel], np.frombuffer(data, dtype=ID_DTYPE))
        return hit
