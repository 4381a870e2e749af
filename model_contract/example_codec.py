"""TensorFlow-free encoding and decoding of `tf.train.Example` protos.

The wire format is protobuf (example.proto / feature.proto):

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }      // map = repeated {key = 1; value = 2}
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2; Int64List int64_list = 3; } }
    Int64List { repeated int64 value = 1 [packed = true]; }

Why hand-rolled: the producer writes millions of examples per shard and importing TensorFlow into every
Beam worker costs seconds and hundreds of MB; the trainer must parse examples without TensorFlow at all.
Varints go through a small C extension (`_varint.c`, ~25x faster) when it was built, else through numpy
(a handful of vectorised passes per feature); both give the same bytes. Encoding is
deterministic: features are written in sorted key order with packed int64 lists, which TensorFlow's own
parser reads (tests check that with `tf.data`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

try:  # optional C accelerator (setup.py builds it; byte-identical to the numpy path)
    from model_contract import _varint as _fast
except ImportError:  # pragma: no cover - exercised where no compiler was available
    _fast = None

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


def _varint_bytes(values: np.ndarray) -> tuple:
    """Packed varints of an integer array as (uint8 array, bytes per value).

    Builds an (n, L) byte matrix, L = bytes of the largest value, and keeps the needed bytes with one
    boolean mask: a few whole-array passes instead of a Python loop per value. Negative int64 values take
    10 bytes (two's complement), as protobuf does.
    """
    v = np.asarray(values)
    if v.dtype != np.int64:
        v = v.astype(np.int64)
    v = v.view(np.uint64)
    if v.size == 0:
        return np.zeros(0, np.uint8), np.zeros(0, np.int64)
    vmax = int(v.max())
    if vmax < 0x80:  # every value is one byte (segment ids)
        return v.astype(np.uint8), np.ones(v.size, np.int64)
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
    return groups[keep], keep.sum(axis=1)


def _encode_varints_numpy(values: np.ndarray) -> bytes:
    return _varint_bytes(values)[0].tobytes()


def encode_varints(values: np.ndarray) -> bytes:
    """Packed varint encoding of an integer array (the C extension when built, else numpy)."""
    if _fast is None:
        return _encode_varints_numpy(values)
    return _fast.encode_varints(np.ascontiguousarray(values, dtype="<i8"))


def decode_varints(data: bytes | memoryview | np.ndarray) -> np.ndarray:
    """Inverse of `encode_varints`: a packed varint payload to an int64 array."""
    if _fast is None:
        return _decode_varints_numpy(data)
    return np.frombuffer(_fast.decode_varints(data), dtype="<i8")


def _decode_varints_numpy(data: bytes | memoryview | np.ndarray) -> np.ndarray:
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
def _length(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    return encode_varint(n)


# Tags of the nested LEN fields: Example.features / Features.feature entry = 1, entry.value = 2,
# Feature.int64_list = 3, Int64List.value = 1 (packed).
_TAG1, _TAG2, _TAG3 = b"\x0a", b"\x12", b"\x1a"


_KEY_FIELDS: dict = {}  # feature name -> its encoded map-entry key field (a handful of names per process)


def _key_field(name: str) -> bytes:
    field = _KEY_FIELDS.get(name)
    if field is None:
        key = name.encode("utf-8")
        field = _KEY_FIELDS[name] = _TAG1 + _length(len(key)) + key
    return field


def _feature_entry_parts(parts: list, key_field: bytes, packed: bytes) -> int:
    """Append one map entry's pieces (headers computed from lengths, payload not copied); return its size."""
    n = len(packed)
    list_head = _TAG1 + _length(n) if n else b""
    int64_list_len = len(list_head) + n
    feature_head = _TAG3 + _length(int64_list_len)
    feature_len = len(feature_head) + int64_list_len
    value_head = _TAG2 + _length(feature_len)
    entry_len = len(key_field) + len(value_head) + feature_len
    entry_head = _TAG1 + _length(entry_len)
    parts += (entry_head, key_field, value_head, feature_head, list_head, packed)
    return len(entry_head) + entry_len


def encode_example(features: Mapping[str, np.ndarray]) -> bytes:
    """Serialize int64 features to a `tf.train.Example`; keys in sorted order, so bytes are reproducible.

    Every nested header is computed from lengths first and the pieces are joined once, so each payload byte is
    copied once (nesting by concatenation copied it four times: ~70 us per 2048-token example, measured)."""
    names = sorted(features)
    if _fast is not None and hasattr(_fast, "encode_int64_example"):  # one C call, without the GIL
        return _fast.encode_int64_example(tuple((_key_field(name), np.ascontiguousarray(features[name], dtype="<i8"))
                                                for name in names))
    parts = [b"", b""]
    body_len = 0
    for name in names:
        body_len += _feature_entry_parts(parts, _key_field(name), encode_varints(features[name]))
    parts[0], parts[1] = _TAG1, _length(body_len)
    return b"".join(parts)


@dataclass(frozen=True)
class PieceColumn:
    """A dense column of a block of `n` examples of `seq_len` tokens that follows from where its pieces start:
    per token its position in its piece (POSITIONS) or its piece's number inside its example, from 1
    (SEGMENT_IDS), 0 on the padding from `real` on. `cuts`: the pieces' starts, rising offsets into the block,
    every example's start below `real` among them; `splits[e]`: example e's first piece (n + 1 entries).

    The C framer writes it from the starts alone (`_varint.c`, Derived), so the packer builds no int64 array for
    it and the framer makes no pass over one; `dense()` is the same column as (values, splits) otherwise."""
    POSITIONS = 1
    SEGMENT_IDS = 2

    kind: int
    cuts: np.ndarray  # int64 [pieces]
    splits: np.ndarray  # int64 [n + 1]
    real: int
    seq_len: int

    def dense(self) -> tuple:
        n = self.splits.size - 1
        total = n * self.seq_len
        piece_len = np.diff(np.append(self.cuts, self.real))
        values = np.zeros(total, dtype=np.int64)
        if self.kind == self.POSITIONS:
            values[:self.real] = np.arange(self.real, dtype=np.int64) - np.repeat(self.cuts, piece_len)
        else:
            segment = np.arange(1, self.cuts.size + 1, dtype=np.int64) - np.repeat(self.splits[:-1],
                                                                                   np.diff(self.splits))
            values[:self.real] = np.repeat(segment, piece_len)
        return values, np.arange(0, total + 1, self.seq_len, dtype=np.int64)


def _frame_entry(name: str, column) -> tuple:
    """One feature's entry for `_varint.frame_int64_examples`."""
    if isinstance(column, PieceColumn):
        return (_key_field(name), column.kind, np.ascontiguousarray(column.cuts, dtype="<i8"),
                np.ascontiguousarray(column.splits, dtype="<i8"), int(column.real), int(column.seq_len))
    return (_key_field(name), np.ascontiguousarray(column[0], dtype="<i8"),
            np.ascontiguousarray(column[1], dtype="<i8"))


def frame_entries(columns: Mapping[str, object]) -> tuple:
    """The C framer's entries for `columns`, in the order every Example writes its features (sorted names)."""
    return tuple(_frame_entry(name, columns[name]) for name in sorted(columns))


def frame_examples(columns: Mapping[str, object], n: int) -> bytes:
    """n `tf.train.Example`s framed as TFRecord records, back to back: what `frame_record(encode_example(...))`
    gives for each example, in one call. `columns` maps a feature to (int64 values, splits), example e's value
    being values[splits[e]:splits[e + 1]], or to a PieceColumn (transforms/shard/packing.py's blocks). With the C
    extension the whole block is encoded, checksummed and framed without the GIL; without it, example by
    example."""
    if _fast is not None and hasattr(_fast, "frame_int64_examples"):
        return _fast.frame_int64_examples(frame_entries(columns), n)
    from model_contract.tfrecord import frame_record  # noqa: PLC0415 - tfrecord imports nothing of this module

    names = sorted(columns)
    dense = {name: c.dense() if isinstance(c, PieceColumn) else c for name, c in columns.items()}
    records = []
    for e in range(n):
        example = {name: dense[name][0][int(dense[name][1][e]):int(dense[name][1][e + 1])] for name in names}
        records.append(frame_record(encode_example(example)))
    return b"".join(records)


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
