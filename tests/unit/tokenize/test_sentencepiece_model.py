"""transforms/tokenize/sentencepiece_model.py on its own: the model type, the normalizer spec and the pieces read
from a SentencePiece ModelProto built here byte by byte (real models: tests/fixtures/sp_models.py and the tokenizer
tests that load them)."""
from __future__ import annotations

import struct

import pytest

from transforms.tokenize import sentencepiece_model as spm


def _varint(n: int) -> bytes:
    out = b""
    while n >= 0x80:
        out, n = out + bytes([n & 0x7F | 0x80]), n >> 7
    return out + bytes([n])


def _field(num: int, value) -> bytes:
    if isinstance(value, int):
        return _varint(num << 3) + _varint(value)
    if isinstance(value, float):
        return _varint(num << 3 | 5) + struct.pack("<f", value)
    return _varint(num << 3 | 2) + _varint(len(value)) + value


def _piece(text: str, score: float, kind=None) -> bytes:
    return _field(1, text.encode()) + _field(2, score) + (b"" if kind is None else _field(3, kind))


def test_varint_reads_multi_byte_values_and_returns_the_next_offset():
    assert spm._varint(b"\x05\xff", 0) == (5, 1)
    assert spm._varint(b"\x00\xac\x02", 1) == (300, 3)


def test_model_type_comes_from_the_trainer_spec_and_defaults_to_unigram():
    assert spm.model_type(_field(2, _field(3, 2))) == "bpe"
    assert spm.model_type(_field(2, _field(3, 9))) == "type-9"
    assert spm.model_type(_field(1, _piece("a", 0.0))) == "unigram"


def test_pieces_in_id_order_with_score_type_and_the_defaults():
    long_piece = "x" * 200  # a length over 127: a two-byte varint
    model = (_field(1, _piece("<unk>", 0.0, 2)) + _field(1, _piece("▁the", -1.5))
             + _field(1, _piece(long_piece, -2.0, 4) + _field(9, 7)) + _field(2, _field(3, 2)))
    assert spm.model_pieces(model) == (("<unk>", 0.0, 2), ("▁the", -1.5, 1), (long_piece, -2.0, 4))


def test_spec_reads_the_normalizer_and_flags_and_keeps_the_protos_defaults():
    model = _field(3, _field(1, b"identity") + _field(3, 0)) + _field(2, _field(35, 1))
    spec = spm._spec(model)
    assert spec["normalizer"] == "identity" and spec["add_dummy_prefix"] == 0 and spec["byte_fallback"] == 1
    assert spec["escape_whitespaces"] == 1 and spec["charsmap"] == b""  # absent: the proto's defaults


def test_an_unknown_wire_type_is_refused():
    with pytest.raises(ValueError, match="wire type 7"):
        list(spm._fields(_varint(1 << 3 | 7)))
