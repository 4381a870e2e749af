"""model_contract/hashing.py: the one sha256 stream, the one keyed 64-bit hash, the one directory fsync."""
from __future__ import annotations

import hashlib
import os
import struct

from model_contract import hashing
from pipeline.ops import incremental
from pipeline.tools import verify_files
from transforms.shard import documents, mixture


def _blake64(person: bytes, data: bytes) -> int:
    """The definition the shards' bytes depend on, written out independently of the helper."""
    return struct.unpack("<Q", hashlib.blake2b(data, digest_size=8, person=person).digest())[0]


def test_sha256_streams_across_block_boundaries(tmp_path):
    data = os.urandom(3 * 1000 + 17)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    with open(path, "rb") as f:
        assert hashing.sha256_stream(f, block=1000) == (len(data), hashlib.sha256(data).hexdigest())
    assert hashing.sha256_file(str(path)) == (len(data), hashlib.sha256(data).hexdigest())
    # every side that hashes files uses it: the ledger / dead letters (incremental) and verify agree
    assert incremental.file_sha256(str(path)) == verify_files._digest(str(path)) == hashing.sha256_file(str(path))


def test_sha256_file_uses_the_callers_opener(tmp_path):
    opened = []
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")

    def opener(p):
        opened.append(p)
        return open(p, "rb")

    assert hashing.sha256_file(str(path), opener=opener) == (3, hashlib.sha256(b"abc").hexdigest())
    assert opened == [str(path)]


def test_hash64_is_keyed_blake2b_and_the_keys_keep_uses_apart():
    parts = (b"split", (12345).to_bytes(8, "little"))
    assert hashing.hash64(b"pileprep-key", *parts) == _blake64(b"pileprep-key", b"".join(parts))
    assert hashing.hash64(b"pileprep-key", *parts) != hashing.hash64(b"pileprep-mix", *parts)
    # the document id, split and mixture hashes are the definitions shards were built with
    assert documents.document_id("hello") == _blake64(b"pileprep-doc", b"hello") >> 1
    assert len({documents.ID_KEY, documents.SPLIT_ORDER_KEY, mixture.MIX_KEY}) == 3


def test_fsync_directory_fsyncs_an_open_directory(tmp_path, monkeypatch):
    seen = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (seen.append(os.path.isdir(f"/proc/self/fd/{fd}")), real(fd)))
    hashing.fsync_directory(str(tmp_path))
    assert seen == [True]
