"""Packing token streams into fixed-length examples: pure functions, no I/O.

Documents (token ids + EOS) are laid end to end; an example holds exactly `seq_len` tokens. A document that
does not fit is split and continues in the next example (never truncated). Padding appears only at the very
end of a packing group (one per shard), so the padding fraction is about num_shards * seq_len / 2 / tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from model_contract import INPUT_IDS, PIECE_DOC_IDS, PIECE_OFFSETS, POSITIONS, SEGMENT_IDS


@dataclass
class PackedExample:
    input_ids: np.ndarray  # int64 [seq_len]
    segment_ids: np.ndarray  # int64 [seq_len]; 0 = padding, 1..n = n-th piece
    positions: np.ndarray  # int64 [seq_len]; position inside the piece
    piece_doc_ids: np.ndarray  # int64 [n]
    piece_offsets: np.ndarray  # int64 [n]; token offset of the piece in its document
    padding: int

    def features(self) -> dict:
        return {INPUT_IDS: self.input_ids, SEGMENT_IDS: self.segment_ids, POSITIONS: self.positions,
                PIECE_DOC_IDS: self.piece_doc_ids, PIECE_OFFSETS: self.piece_offsets}


class _ExampleBuilder:
    def __init__(self, seq_len: int, pad_id: int):
        self.seq_len = seq_len
        self.pad_id = pad_id
        self._ramp = np.arange(seq_len, dtype=np.int64)
        self.reset()

    def reset(self) -> None:
        self.input_ids = np.empty(self.seq_len, dtype=np.int64)
        self.segment_ids = np.empty(self.seq_len, dtype=np.int64)
        self.positions = np.empty(self.seq_len, dtype=np.int64)
        self.doc_ids: list = []
        self.offsets: list = []
        self.fill = 0

    @property
    def room(self) -> int:
        return self.seq_len - self.fill

    def add_piece(self, doc_id: int, offset: int, tokens: np.ndarray) -> None:
        a, b = self.fill, self.fill + tokens.size
        self.input_ids[a:b] = tokens
        self.segment_ids[a:b] = len(self.doc_ids) + 1
        self.positions[a:b] = self._ramp[:tokens.size]
        self.doc_ids.append(doc_id)
        self.offsets.append(offset)
        self.fill = b

    def finish(self) -> PackedExample:
        padding = self.room
        if padding:
            self.input_ids[self.fill:] = self.pad_id
            self.segment_ids[self.fill:] = 0
            self.positions[self.fill:] = 0
        example = PackedExample(self.input_ids, self.segment_ids, self.positions,
                                np.array(self.doc_ids, dtype=np.int64), np.array(self.offsets, dtype=np.int64),
                                padding)
        self.reset()
        return example


def pack_documents(documents: Iterable, seq_len: int, pad_id: int) -> Iterator[PackedExample]:
    """Pack (doc_id, tokens-including-EOS) pairs, in the given order, into examples of exactly seq_len."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    builder = _ExampleBuilder(seq_len, pad_id)
    for doc_id, tokens in documents:
        offset = 0
        while offset < tokens.size:
            take = min(builder.room, tokens.size - offset)
            builder.add_piece(doc_id, offset, tokens[offset:offset + take])
            offset += take
            if builder.room == 0:
                yield builder.finish()
    if builder.fill:
        yield builder.finish()
