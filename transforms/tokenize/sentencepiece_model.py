"""The SentencePiece model file's fields that an encode depends on, read from the proto's wire format.

sentencepiece's own generated module needs a newer protobuf runtime than the pinned one, so the few fields the
fast backends (transforms/tokenize/tokenizer_backends.py) and the long-document planner
(transforms/tokenize/long_documents.py) need are read here: the model type, the normalizer spec and the pieces.
"""
from __future__ import annotations

import functools
import struct

# sentencepiece_model.proto: ModelProto.trainer_spec = 2, TrainerSpec.model_type = 3 (UNIGRAM 1, BPE 2, ...)
_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


def _varint(buf: bytes, i: int):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of a serialized protobuf message, top level only."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield num, wire, value


def model_type(model_bytes: bytes) -> str:
    """The SentencePiece model's algorithm, read from the proto's wire format (sentencepiece's own generated
    module needs a newer protobuf runtime than the pinned one). Unigram is the proto's default."""
    for num, wire, value in _fields(model_bytes):
        if num == 2 and wire == 2:
            for n, w, v in _fields(value):
                if n == 3 and w == 0:
                    return _MODEL_TYPES.get(v, f"type-{v}")
    return "unigram"


# sentencepiece_model.proto, the fields an encode depends on (defaults as in the proto)
_PIECE_TYPES = {1: "normal", 2: "unknown", 3: "control", 4: "user-defined", 5: "unused", 6: "byte"}


def _spec(model_bytes: bytes) -> dict:
    """What a SentencePiece BPE encode depends on beyond the pieces: the normalizer (ModelProto field 3) and the
    trainer flags that change encoding (field 2), with the proto's defaults where a field is absent."""
    spec = {"normalizer": "nmt_nfkc", "charsmap": b"", "add_dummy_prefix": 1, "remove_extra_whitespaces": 1,
            "escape_whitespaces": 1, "byte_fallback": 0, "treat_whitespace_as_suffix": 0}
    names = {(3, 1): "normalizer", (3, 2): "charsmap", (3, 3): "add_dummy_prefix", (3, 4): "remove_extra_whitespaces",
             (3, 5): "escape_whitespaces", (2, 35): "byte_fallback", (2, 24): "treat_whitespace_as_suffix"}
    for num, wire, value in _fields(model_bytes):
        if num in (2, 3) and wire == 2:
            for n, _w, v in _fields(value):
                if (num, n) in names:
                    spec[names[num, n]] = v.decode("utf-8", "replace") if (num, n) == (3, 1) else v
    return spec


@functools.lru_cache(maxsize=2)  # the driver asks several times per run (checks, parity texts, the encoder)
def model_pieces(model_bytes: bytes) -> tuple:
    """(piece, score, type) of every piece, in id order, from the proto (ModelProto.pieces = 1; piece 1, score 2
    as a float32, type 3 defaulting to NORMAL): the model file, not a processor, is what a backend is built from.
    One flat loop rather than `_fields` per piece: a worker builds its encoder from this at start-up."""
    out = []
    unpack = struct.Struct("<f").unpack_from
    for num, wire, value in _fields(model_bytes):
        if num != 1 or wire != 2:
            continue
        piece, score, kind = "", 0.0, 1
        i, end = 0, len(value)
        while i < end:
            key = value[i]
            i += 1
            if key == 0x0A:  # field 1, bytes: the piece (length < 128 in any real model; else the general path)
                n = value[i]
                if n >= 0x80:
                    n, i = _varint(value, i)
                else:
                    i += 1
                piece = value[i:i + n].decode("utf-8")
                i += n
            elif key == 0x15:  # field 2, float32: the score
                score = unpack(value, i)[0]
                i += 4
            elif key == 0x18:  # field 3, varint: the type
                kind, i = _varint(value, i)
            else:  # anything else: skip by wire type
                i -= 1
                key, i = _varint(value, i)
                wire_type = key & 7
                if wire_type == 0:
                    _v, i = _varint(value, i)
                elif wire_type == 2:
                    n, i = _varint(value, i)
                    i += n
                elif wire_type in (1, 5):
                    i += 8 if wire_type == 1 else 4
                else:
                    raise ValueError(f"unsupported protobuf wire type {wire_type}")
        out.append((piece, score, kind))
    return tuple(out)
