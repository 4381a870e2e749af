"""The hashes and the directory fsync every side uses: one copy each.

It lives in `model_contract` because the trainer may import nothing else of pileprep (see docs/DESIGN.md#rooms)
and checks shard sha256s the same way `pileprep verify` and the shard job record them. Standard library only.

- `sha256_file`: size and sha256 of a file's raw bytes, streamed in 8 MiB blocks (bounded memory for
  multi-GB shards and inputs). The opener is the caller's: the trainer opens local files, the pipeline opens
  through Beam's FileSystems (transforms/io/io_utils.py `open_read`) so S3 objects hash the same way. A hash
  helper is not a reader: `verify` still reads shards with its own record parser (pipeline/tools/verify.py).
- `hash64`: a keyed 64-bit blake2b of byte strings. The key (`person`) separates uses, so the split, order and
  mixture hashes of one document are independent (transforms/shard/documents.py, transforms/shard/mixture.py).
  The bytes of every shard depend on these values: changing the algorithm or a key changes every dataset.
- `fsync_directory`: make a rename or a new file in a directory durable (POSIX: the directory entry is only
  on disk once the directory itself is fsynced).
"""
from __future__ import annotations

import hashlib
import os
import struct

HASH_BLOCK = 8 << 20  # 8 MiB: large enough that the per-call overhead is noise, small enough to bound memory


def _open_local(path: str):
    return open(path, "rb", buffering=0)


def sha256_stream(f, block: int = HASH_BLOCK) -> tuple:
    """(bytes, sha256 hex) of everything left to read in the binary file object `f`."""
    sha, n = hashlib.sha256(), 0
    while True:
        data = f.read(block)
        if not data:
            return n, sha.hexdigest()
        sha.update(data)
        n += len(data)


def sha256_file(path: str, opener=_open_local) -> tuple:
    """(bytes, sha256 hex) of the file at `path`, opened with `opener(path)` (a context manager yielding a binary
    file object; default: a local file)."""
    with opener(path) as f:
        return sha256_stream(f)


def hash64(person: bytes, *parts: bytes) -> int:
    """A 64-bit unsigned blake2b hash of `parts`, keyed by `person` (at most 16 bytes)."""
    h = hashlib.blake2b(digest_size=8, person=person)
    for p in parts:
        h.update(p)
    return struct.unpack("<Q", h.digest())[0]


def fsync_directory(path: str) -> None:
    """Flush a directory's entries (a rename into it, a new file) to stable storage. Local paths only."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
