"""TensorFlow-free encoding and decoding of `tf.train.Example` protos.

The wire format is protobuf (example.proto / feature.proto):

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }      // map = repeated {key = 1; value = 2}
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    Int64List { repeated int64 value = 1 [packed = true]; }

Why hand-rolled: the producer writes millions of examples per shard and importing TensorFlow into every
Beam worker costs seconds and hundreds of MB; the trainer must parse examples without TensorFlow at all.
Varints are encoded and decoded with numpy, a handful of vectorised passes per feature. Encoding is
deterministic: features are written in sorted key order with packed int64 lists, which TensorFlow's own
parser reads (tests check that with `tf.data`).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

_WIRE_VARINT = 0
_WIRE_I64 = 1
_WIRE_LEN = 2
_WIRE_I32 = 5


# ---------------------------------------------------------------------------------------------- varints
def encode_varint(value: int) -> bytes:
    """One unsigned varint (used for tags and lengths)."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_varints(values: np.ndarray) -> bytes:
    """Packed varint encoding of an integer array (negative int64 values take 10 bytes, as protobuf does).

    Builds an (n, L) byte matrix, L = bytes of the largest value, and keeps the needed bytes with one
    boolean mask: a few whole-array passes instead of a Python loop per value.
    """
    v = np.asarray(values)
    if v.size == 0:
        return b""
    if v.dtype != np.int64:
        v = v.astype(np.int64)
    v = v.view(np.uint64)  # two's complement: negatives become large and take 10 bytes
    vmax = int(v.max())
    if vmax < 0x80:  # every value is one byte (segment ids)
        return v.astype(np.uint8).tobytes()
    width = (vmax.bit_length() + 6) // 7
    word = np.uint32 if vmax < (1 << 32) else np.uint64  # narrower words make the passes cheaper
    v = v.astype(word, copy=False)
    groups = np.empty((v.size, width), np.uint8)
    keep = np.empty((v.size, width), bool)
    keep[:, 0] = True
    for j in range(width):
        groups[:, j] = v >> word(7 * j)
        if j:
            keep[:, j] = v >= word(1 << (7 * j))
    groups &= 0x7F
    groups[:, :-1] |= keep[:, 1:].view(np.uint8) << 7  # continuation bit where another byte follows
    return groups[keep].tobytes()


def decode_varints(data: bytes | memoryview | np.ndarray) -> np.ndarray:
    """Inverse of `encode_varints`: a packed varint payload to an int64 array."""
    b = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    if b.size == 0:
        return np.zeros(0, dtype=np.int64)
    if b[-1] & 0x80:
        raise ValueError("packed varint payload ends inside a varint")
    is_last = b < 0x80
    if is_last.all():  # every value fits one byte: the common case for segment ids
        return b.astype(np.int64)
    ends = np.flatnonzero(is_last)
    starts = np.concatenate(([0], ends[:-1] + 1))
    group = np.repeat(np.arange(ends.size), ends - starts + 1)
    shift = (np.arange(b.size) - starts[group]) * 7
    if shift.max() > 63:
        raise ValueError("varint longer than 10 bytes")
    parts = (b & 0x7F).astype(np.uint64) << shift.astype(np.uint64)
    return np.add.reduceat(parts, starts).view(np.int64)


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _iter_fields(buf: memoryview):
    """Yield (field_number, wire_type, value) for one message; LEN values are memoryviews."""
    pos = 0
    end = len(buf)
    while pos < end:
        tag, pos = _read_varint(buf, pos)
        field, wire = tag >> 3, tag & 7
        if wire == _WIRE_VARINT:
            value, pos = _read_varint(buf, pos)
        elif wire == _WIRE_LEN:
            length, pos = _read_varint(buf, pos)
            if pos + length > end:
                raise ValueError(f"field {field} runs past the end of its message")
            value = buf[pos:pos + length]
            pos += length
        elif wire == _WIRE_I64:
            value = buf[pos:pos + 8]
            pos += 8
        elif wire == _WIRE_I32:
            value = buf[pos:pos + 4]
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire} for field {field}")
        yield field, wire, value


# ---------------------------------------------------------------------------------------------- encode
def _len_field(field: int, payload: bytes) -> bytes:
    return encode_varint((field << 3) | _WIRE_LEN) + encode_varint(len(payload)) + payload


def encode_int64_feature(values: np.ndarray) -> bytes:
    """A serialized `Feature` holding an `Int64List` (packed)."""
    packed = encode_varints(values)
    int64_list = _len_field(1, packed) if packed else b""
    return _len_field(3, int64_list)


def encode_example(features: Mapping[str, np.ndarray]) -> bytes:
    """Serialize int64 features to a `tf.train.Example`; keys in sorted order, so bytes are reproducible."""
    body = bytearray()
    for name in sorted(features):
        entry = _len_field(1, name.encode("utf-8")) + _len_field(2, encode_int64_feature(features[name]))
        body += _len_field(1, entry)
    return _len_field(1, bytes(body))


# ---------------------------------------------------------------------------------------------- decode
def _decode_feature(buf: memoryview):
    for field, wire, value in _iter_fields(buf):
        if field == 3 and wire == _WIRE_LEN:  # Int64List
            chunks = []
            for f, w, v in _iter_fields(value):
                if f != 1:
                    continue
                if w == _WIRE_LEN:  # packed
                    chunks.append(decode_varints(v))
                elif w == _WIRE_VARINT:  # unpacked, one value per tag
                    chunks.append(np.array([v], dtype=np.uint64).view(np.int64))
            return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
        if field == 2 and wire == _WIRE_LEN:  # FloatList
            chunks = []
            for f, w, v in _iter_fields(value):
                if f == 1 and w == _WIRE_LEN:
                    chunks.append(np.frombuffer(v, dtype="<f4"))
                elif f == 1 and w == _WIRE_I32:
                    chunks.append(np.frombuffer(v, dtype="<f4"))
            return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
        if field == 1 and wire == _WIRE_LEN:  # BytesList
            return [bytes(v) for f, w, v in _iter_fields(value) if f == 1]
    return np.zeros(0, dtype=np.int64)  # a Feature with no kind set


def decode_example(data: bytes) -> dict[str, object]:
    """Parse a serialized `tf.train.Example` into {name: np.ndarray (int64/float32) or list[bytes]}."""
    out: dict[str, object] = {}
    for field, wire, features in _iter_fields(memoryview(data)):
        if field != 1 or wire != _WIRE_LEN:
            continue
        for f, w, entry in _iter_fields(features):
            if f != 1 or w != _WIRE_LEN:
                continue
            key = None
            value = None
            for ef, ew, ev in _iter_fields(entry):
                if ef == 1:
                    key = bytes(ev).decode("utf-8")
                elif ef == 2:
                    value = _decode_feature(ev)
            if key is not None:
                out[key] = value if value is not None else np.zeros(0, dtype=np.int64)
    return out
