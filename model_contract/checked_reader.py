"""The one checked way to read a shard: its size and record count must be those of its manifest entry.

A shard file swapped on disk (another shard's file, a cut copy, one record appended) still parses as TFRecord,
so a reader that only parses it would carry the damage into whatever it derives (a Parquet export, a chunk
database, a neighbours sidecar claiming alignment with records that are not there). Every reader of a
dataset's shards - the trainer (trainer/data.py), `pileprep export` (pipeline/tools/export.py), `inspect`, and
the retrieval jobs (pipeline/retrieval/) - checks the same two facts and refuses by the shard's manifest path.

Dependency-free like the rest of model_contract: the caller opens the stream (local file, object store).
"""
from __future__ import annotations

from typing import BinaryIO, Iterator, Optional

from model_contract.contract import ContractError
from model_contract.tfrecord import iter_records


class ShardMismatchError(ContractError):
    """A shard file whose size or record count is not its manifest entry's."""


def _field(shard, key: str):
    return shard[key] if isinstance(shard, dict) else getattr(shard, key)


def size_problem(shard, size: int) -> Optional[str]:
    """The refusal for a shard file of `size` bytes, or None when it is the manifest's size."""
    want = _field(shard, "bytes")
    if size == want:
        return None
    return (f"shard {_field(shard, 'path')}: {size} bytes, the manifest says {want} (cut short, replaced or still "
            f"being written): re-run the shard job or restore the file")


def count_problem(shard, records: int, more: str = "") -> Optional[str]:
    """The refusal for a shard file holding `records` records, or None when it is the manifest's count."""
    want = _field(shard, "examples")
    if records == want:
        return None
    return (f"shard {_field(shard, 'path')}: {more}{records} records, the manifest says {want} (another shard's file, "
            f"or damaged): re-run the shard job or restore the file")


def stream_size(stream) -> Optional[int]:
    """The size of an open stream when it can tell (a local file's fstat, a seekable object), else None."""
    try:
        import os  # noqa: PLC0415

        return os.fstat(stream.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        pass
    try:
        here = stream.tell()
        end = stream.seek(0, 2)
        stream.seek(here)
        return end
    except (AttributeError, OSError, ValueError):
        return None


class _CountingReader:
    """Counts the bytes read through it (the size check for streams that cannot say their size up front)."""

    def __init__(self, stream: BinaryIO):
        self.stream, self.bytes = stream, 0

    def read(self, n: int = -1) -> bytes:
        data = self.stream.read(n)
        self.bytes += len(data)
        return data


def iter_checked_records(stream: BinaryIO, shard, *, name: Optional[str] = None, verify: bool = True
                         ) -> Iterator[bytes]:
    """The records of one shard (`shard`: a ShardInfo or its dict), refusing with ShardMismatchError, before the
    first record when the size is known up front, else as soon as the count or the bytes disagree."""
    size = stream_size(stream)
    if size is not None and size_problem(shard, size):
        raise ShardMismatchError(size_problem(shard, size))
    want = _field(shard, "examples")
    counting = _CountingReader(stream)
    n = 0
    for record in iter_records(counting, verify=verify, name=name or _field(shard, "path")):
        n += 1
        if n > want:
            raise ShardMismatchError(count_problem(shard, n, more="at least "))
        yield record
    if n != want:
        raise ShardMismatchError(count_problem(shard, n))
    if size_problem(shard, counting.bytes):
        raise ShardMismatchError(size_problem(shard, counting.bytes))
