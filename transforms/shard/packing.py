"""Packing token streams into fixed-length examples: pure functions, no I/O.

Documents (token ids + EOS) are laid end to end; an example holds exactly `seq_len` tokens. A document that
does not fit is split and continues in the next example (never truncated). Padding appears only at the very
end of a packing group (one per shard), so the padding fraction is about num_shards * seq_len / 2 / tokens.

The work is done a block of examples at a time with whole-array numpy passes (`pack_blocks`): a packer thread
then spends a few calls per block holding the GIL instead of several per example and per piece, and the block
goes to the writer as a whole (model_contract.frame_examples, one C call without the GIL). A block holds at
most `block_examples * seq_len` tokens whatever the documents' sizes: a long document is taken a slice at a time.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from model_contract import INPUT_IDS, PIECE_DOC_IDS, PIECE_OFFSETS, POSITIONS, SEGMENT_IDS
from model_contract.example_codec import PieceColumn

BLOCK_EXAMPLES = 64  # 131k tokens at seq_len 2048: a 1 MiB int64 array of tokens, ~0.8 MB of framed records


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


@dataclass
class PackedBlock:
    """Consecutive examples: the tokens as an [examples, seq_len] array, the per-piece features flat, example e's
    pieces being piece_*[piece_splits[e]:piece_splits[e + 1]], and where those pieces start in the block
    (`cuts`), from which segment ids and positions follow. Only a group's last block has padding, at its end."""
    input_ids: np.ndarray  # int64 [n, seq_len]
    piece_doc_ids: np.ndarray  # int64 [pieces]
    piece_offsets: np.ndarray  # int64 [pieces]
    piece_splits: np.ndarray  # int64 [n + 1]
    cuts: np.ndarray  # int64 [pieces]: each piece's first token in the block (every example's first is one)
    padding: int  # padding tokens, all in the last example

    @property
    def examples(self) -> int:
        return self.input_ids.shape[0]

    def _piece_column(self, kind: int) -> PieceColumn:
        n, seq_len = self.input_ids.shape
        return PieceColumn(kind, self.cuts, self.piece_splits, n * seq_len - self.padding, seq_len)

    # Built once, on first use (`example()`, tests): the shard stage frames them from `cuts` and never builds them.
    @functools.cached_property
    def segment_ids(self) -> np.ndarray:  # int64 [n, seq_len]; 0 = padding, 1..k = k-th piece of the example
        return self._piece_column(PieceColumn.SEGMENT_IDS).dense()[0].reshape(self.input_ids.shape)

    @functools.cached_property
    def positions(self) -> np.ndarray:  # int64 [n, seq_len]; position inside the piece
        return self._piece_column(PieceColumn.POSITIONS).dense()[0].reshape(self.input_ids.shape)

    def columns(self) -> dict:
        """{feature: (values, splits) or PieceColumn} for model_contract.frame_examples: example e's value of a
        feature is values[splits[e]:splits[e + 1]]; segment ids and positions are framed from `cuts`."""
        n, seq_len = self.input_ids.shape
        dense = np.arange(0, (n + 1) * seq_len, seq_len, dtype=np.int64)
        return {INPUT_IDS: (self.input_ids.reshape(-1), dense),
                SEGMENT_IDS: self._piece_column(PieceColumn.SEGMENT_IDS),
                POSITIONS: self._piece_column(PieceColumn.POSITIONS),
                PIECE_DOC_IDS: (self.piece_doc_ids, self.piece_splits),
                PIECE_OFFSETS: (self.piece_offsets, self.piece_splits)}

    def example(self, e: int) -> PackedExample:
        a, b = int(self.piece_splits[e]), int(self.piece_splits[e + 1])
        return PackedExample(self.input_ids[e], self.segment_ids[e], self.positions[e], self.piece_doc_ids[a:b],
                             self.piece_offsets[a:b], self.padding if e == self.examples - 1 else 0)


def _build_block(pieces: list, seq_len: int, pad_id: int) -> PackedBlock:
    """One block from its pieces [(doc_id, offset in the document, tokens)], laid end to end.

    A piece here is a document's part inside the block; cutting the stream every seq_len tokens cuts those into
    the examples' pieces. Every example's piece boundaries are the union of the block's piece starts and the
    example starts: the segment id (piece number inside its example, from 1) and the position (distance from its
    piece's start) of every token follow from them (PieceColumn), and are framed from them."""
    doc_of, offset_of, arrays = zip(*pieces)
    lengths = np.array([a.size for a in arrays], dtype=np.int64)
    real = int(lengths.sum())
    n = -(-real // seq_len)
    total = n * seq_len
    # The token array is allocated once and written once: the tokens (any integer dtype, cast here) and the
    # padding tail, with no fill of the whole array before (a pass over a block is ~1 MiB of int64).
    stream = np.empty(total, dtype=np.int64)
    np.concatenate(arrays, out=stream[:real], casting="unsafe")
    stream[real:] = pad_id
    starts = np.zeros(len(arrays), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    cuts = np.union1d(starts, np.arange(0, real, seq_len, dtype=np.int64))  # every example piece's start
    part = np.searchsorted(starts, cuts, side="right") - 1  # the block piece each example piece belongs to
    doc_ids = np.array(doc_of, dtype=np.int64)[part]
    offsets = np.array(offset_of, dtype=np.int64)[part] + cuts - starts[part]
    splits = np.searchsorted(cuts, np.arange(0, total + 1, seq_len, dtype=np.int64))  # the last is cuts.size
    return PackedBlock(stream.reshape(n, seq_len), doc_ids, offsets, splits, cuts, total - real)


def pack_blocks(documents: Iterable, seq_len: int, pad_id: int,
                block_examples: int = BLOCK_EXAMPLES) -> Iterator[PackedBlock]:
    """Pack (doc_id, tokens-including-EOS) pairs, in the given order, into blocks of examples of exactly seq_len.

    Every block but the last holds `block_examples` full examples; the last holds the rest, padded at its end."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    if block_examples < 1:
        raise ValueError(f"block_examples must be positive, got {block_examples}")
    block_tokens = seq_len * block_examples
    pieces: list = []
    room = block_tokens
    for doc_id, tokens in documents:
        offset = 0
        while offset < tokens.size:
            take = min(room, tokens.size - offset)
            pieces.append((doc_id, offset, tokens[offset:offset + take]))
            offset += take
            room -= take
            if room == 0:
                yield _build_block(pieces, seq_len, pad_id)
                pieces, room = [], block_tokens
    if pieces:
        yield _build_block(pieces, seq_len, pad_id)
