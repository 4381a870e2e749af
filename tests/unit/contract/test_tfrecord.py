"""model_contract/tfrecord.py: a damaged record is refused with its index and byte offset."""
from __future__ import annotations

import io

import numpy as np
import pytest

from model_contract import encode_example
from model_contract.tfrecord import TFRecordCorruptError, frame_record, iter_records


def _records(n=4):
    payloads = [encode_example({"x": np.arange(i + 3)}) for i in range(n)]
    frames = [frame_record(p) for p in payloads]
    offsets = list(np.cumsum([0] + [len(f) for f in frames])[:-1])
    return payloads, b"".join(frames), offsets


def test_a_flipped_payload_byte_is_reported_with_its_offset():
    payloads, blob, offsets = _records()
    damaged = bytearray(blob)
    damaged[offsets[2] + 12 + 1] ^= 0x01  # one bit inside record 2's payload: still parses as bytes
    with pytest.raises(TFRecordCorruptError, match=rf"record 2 at byte offset {offsets[2]} data checksum"):
        list(iter_records(io.BytesIO(bytes(damaged)), name="s.tfrecord"))
    assert list(iter_records(io.BytesIO(blob))) == payloads


def test_a_flipped_length_byte_is_a_checksum_error_with_its_offset():
    _payloads, blob, offsets = _records()
    damaged = bytearray(blob)
    damaged[offsets[1]] ^= 0x01  # record 1's length, off by one: would read a wrong frame, not run short
    with pytest.raises(TFRecordCorruptError, match=rf"record 1 at byte offset {offsets[1]} length checksum"):
        list(iter_records(io.BytesIO(bytes(damaged)), name="s.tfrecord"))
