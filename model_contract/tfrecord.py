"""TFRecord framing, written and read without TensorFlow.

Each record is  uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data),
little-endian, exactly as `tf.io.TFRecordWriter` writes it, so `tf.data.TFRecordDataset` reads our files.
Readers verify both checksums: a flipped bit in a shard is an error, never silently different training data.
The CRC-32C comes from model_contract/crc32c.py, which needs only numpy (google_crc32c when installed), so the
trainer's read path runs where only torch and numpy are (bench/gpu_check.py on a bare GPU machine).
"""
from __future__ import annotations

import struct
from typing import BinaryIO, Iterator, Optional

from model_contract import crc32c

_MASK_DELTA = 0xA282EAD8
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


class TFRecordCorruptError(ValueError):
    """A TFRecord file whose framing or checksums do not verify."""


def masked_crc32c(data: bytes) -> int:
    crc = crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One record's bytes as they go to disk."""
    header = _U64.pack(len(data))
    return header + _U32.pack(masked_crc32c(header)) + data + _U32.pack(masked_crc32c(data))


def _read_framed(stream: BinaryIO, verify: bool, where: str) -> Optional[bytes]:
    """The next record's payload from the stream's position, None at a clean end of file."""
    header = stream.read(12)
    if not header:
        return None
    if len(header) < 12:
        raise TFRecordCorruptError(f"{where} has a truncated header")
    length_bytes = header[:8]
    if verify and _U32.unpack(header[8:])[0] != masked_crc32c(length_bytes):
        raise TFRecordCorruptError(f"{where} length checksum mismatch")
    (length,) = _U64.unpack(length_bytes)
    body = stream.read(length + 4)
    if len(body) < length + 4:
        raise TFRecordCorruptError(f"{where} is truncated")
    data = body[:length]
    if verify and _U32.unpack(body[length:])[0] != masked_crc32c(data):
        raise TFRecordCorruptError(f"{where} data checksum mismatch")
    return data


def iter_records(stream: BinaryIO, *, verify: bool = True, name: str = "<stream>") -> Iterator[bytes]:
    """Yield the payload of every record in a binary stream; raise TFRecordCorruptError on damage.

    Errors name the record's index and the byte offset where its frame starts, so a damaged shard can be
    located (and compared against a good copy) without re-reading it. The length's checksum is verified
    before the length is trusted: a flipped length byte is a checksum error, not a misleading "truncated".
    """
    index, offset = 0, 0
    while True:
        data = _read_framed(stream, verify, f"{name}: record {index} at byte offset {offset}")
        if data is None:
            return
        yield data
        index += 1
        offset += 16 + len(data)


def read_records(path: str, *, verify: bool = True) -> Iterator[bytes]:
    """Yield the records of a local TFRecord file."""
    with open(path, "rb", buffering=1 << 20) as f:
        yield from iter_records(f, verify=verify, name=path)


def read_record_at(stream: BinaryIO, offset: int, *, verify: bool = True, name: str = "<stream>") -> bytes:
    """The payload of the record starting at byte `offset` (random access through a record-offset index)."""
    stream.seek(offset)
    data = _read_framed(stream, verify, f"{name}: record at byte {offset}")
    if data is None:
        raise TFRecordCorruptError(f"{name}: no record at byte {offset} (end of file)")
    return data


def record_offsets(stream: BinaryIO, *, verify: bool = True, name: str = "<stream>") -> list:
    """Byte offset of every record, walking headers only (length CRCs checked); the file must end on a record
    boundary. Readers cache this index so each record is then read once, by seeking."""
    offsets, offset = [], 0
    while True:
        stream.seek(offset)
        header = stream.read(12)
        if not header:
            return offsets
        if len(header) < 12:
            raise TFRecordCorruptError(f"{name}: record {len(offsets)} has a truncated header")
        if verify and _U32.unpack(header[8:])[0] != masked_crc32c(header[:8]):
            raise TFRecordCorruptError(f"{name}: record {len(offsets)} length checksum mismatch")
        offsets.append(offset)
        offset += 16 + _U64.unpack(header[:8])[0]
        stream.seek(offset - 1)
        if len(stream.read(1)) < 1:
            raise TFRecordCorruptError(f"{name}: record {len(offsets) - 1} is truncated")
