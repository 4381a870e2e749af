"""Best-fit packing (`--packing best-fit`): pure functions, no I/O.

The concat packer (transforms/shard/packing.py) lays documents end to end and cuts the stream every `seq_len`
tokens, so most documents that straddle a cut are split although they would fit in one example. Here a document
is split only when it cannot fit (Ding et al. 2024, "Fewer Truncations Improve Language Modeling"):

1. a document longer than `seq_len` gives `len // seq_len` full-length pieces, each an example of its own, and
   its remainder (if any);
2. the remainders and the documents that fit are placed whole by best-fit decreasing: longest first (ties by
   document id, then arrival), each into the open example with the least room that still holds it (ties: the
   example opened first), else into a new example;
3. examples are emitted in a fixed order: the window's full-length pieces in arrival order, then the best-fit
   examples in the order they were opened; every example's unused tail is padding (segment id 0).

Memory is bounded by a window: documents are buffered until they hold `window_examples * seq_len` tokens (plus
the one document that crossed it), then packed and emitted. A larger window packs tighter (fewer part-filled
examples per window) and holds more tokens in memory; the window is in the dataset's config (and its fingerprint)
because it changes the bytes. Every piece of a document lies in one window, so in one shard, in offset order.
"""
from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np

from model_contract import INPUT_IDS, PIECE_DOC_IDS, PIECE_OFFSETS, POSITIONS, SEGMENT_IDS
from transforms.shard.packing import BLOCK_EXAMPLES, PackedExample

DEFAULT_WINDOW_EXAMPLES = 1024  # 2M tokens at seq_len 2048: 4 MiB of uint16 tokens buffered per packer


def plan_window(lengths: Sequence[int], doc_ids: Sequence[int], seq_len: int) -> list:
    """The examples of one window: each a list of pieces (document index in the window, offset, length).

    `lengths[i]` is document i's token count (EOS included) and `doc_ids[i]` its id, in arrival order."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    full_examples: list = []
    items: list = []  # (-length, doc_id, index, offset): sorted, longest first, ties by document id then arrival
    for i, (n, doc_id) in enumerate(zip(lengths, doc_ids)):
        full = n // seq_len
        full_examples.extend([(i, k * seq_len, seq_len)] for k in range(full))
        rest = n - full * seq_len
        if rest:
            items.append((-rest, doc_id, i, full * seq_len))
    items.sort()
    bins: list = []
    room: list = []  # sorted (free tokens, bin number) of the bins that still have room
    for negative, _doc_id, i, offset in items:
        length = -negative
        j = bisect.bisect_left(room, (length, -1))  # the least room that holds it; the lowest bin among equals
        if j == len(room):
            bins.append([(i, offset, length)])
            free, b = seq_len - length, len(bins) - 1
        else:
            free, b = room.pop(j)
            bins[b].append((i, offset, length))
            free -= length
        if free:
            bisect.insort(room, (free, b))
    return full_examples + bins


@dataclass
class BestFitBlock:
    """Consecutive best-fit examples, with the interface of packing.PackedBlock that the shard stage uses
    (`columns()`, `examples`, `padding`, `example(e)`). Unlike a concat block, any example may end in padding, so
    segment ids and positions are dense columns here (the framer's PieceColumn assumes padding only at the end
    of a block)."""
    input_ids: np.ndarray  # int64 [n, seq_len]
    segment_ids: np.ndarray  # int64 [n, seq_len]; 0 = padding
    positions: np.ndarray  # int64 [n, seq_len]
    piece_doc_ids: np.ndarray  # int64 [pieces]
    piece_offsets: np.ndarray  # int64 [pieces]
    piece_splits: np.ndarray  # int64 [n + 1]
    example_padding: np.ndarray  # int64 [n]

    @property
    def examples(self) -> int:
        return self.input_ids.shape[0]

    @functools.cached_property
    def padding(self) -> int:
        return int(self.example_padding.sum())

    def columns(self) -> dict:
        n, seq_len = self.input_ids.shape
        dense = np.arange(0, (n + 1) * seq_len, seq_len, dtype=np.int64)
        return {INPUT_IDS: (self.input_ids.reshape(-1), dense), SEGMENT_IDS: (self.segment_ids.reshape(-1), dense),
                POSITIONS: (self.positions.reshape(-1), dense),
                PIECE_DOC_IDS: (self.piece_doc_ids, self.piece_splits),
                PIECE_OFFSETS: (self.piece_offsets, self.piece_splits)}

    def example(self, e: int) -> PackedExample:
        a, b = int(self.piece_splits[e]), int(self.piece_splits[e + 1])
        return PackedExample(self.input_ids[e], self.segment_ids[e], self.positions[e], self.piece_doc_ids[a:b],
                             self.piece_offsets[a:b], int(self.example_padding[e]))


def build_block(examples: list, window: list, seq_len: int, pad_id: int) -> BestFitBlock:
    """A block from planned examples (`plan_window`'s) over the window's (doc_id, tokens) documents."""
    n = len(examples)
    input_ids = np.full((n, seq_len), pad_id, dtype=np.int64)
    segment_ids = np.zeros((n, seq_len), dtype=np.int64)
    positions = np.zeros((n, seq_len), dtype=np.int64)
    doc_ids, offsets, splits, padding = [], [], [0], []
    ramp = np.arange(seq_len, dtype=np.int64)
    for e, pieces in enumerate(examples):
        at = 0
        for k, (i, offset, length) in enumerate(pieces, start=1):
            doc_id, tokens = window[i]
            input_ids[e, at:at + length] = tokens[offset:offset + length]
            segment_ids[e, at:at + length] = k
            positions[e, at:at + length] = ramp[:length]
            doc_ids.append(doc_id)
            offsets.append(offset)
            at += length
        splits.append(len(doc_ids))
        padding.append(seq_len - at)
    return BestFitBlock(input_ids, segment_ids, positions, np.array(doc_ids, dtype=np.int64),
                        np.array(offsets, dtype=np.int64), np.array(splits, dtype=np.int64),
                        np.array(padding, dtype=np.int64))


def _pack_window(window: list, seq_len: int, pad_id: int, block_examples: int) -> Iterator[BestFitBlock]:
    examples = plan_window([t.size for _, t in window], [d for d, _ in window], seq_len)
    for a in range(0, len(examples), block_examples):
        yield build_block(examples[a:a + block_examples], window, seq_len, pad_id)


def pack_best_fit(documents: Iterable, seq_len: int, pad_id: int, window_examples: int = DEFAULT_WINDOW_EXAMPLES,
                  block_examples: int = BLOCK_EXAMPLES) -> Iterator[BestFitBlock]:
    """Pack (doc_id, tokens-including-EOS) pairs into blocks of best-fit examples of exactly seq_len, a window
    of about `window_examples * seq_len` tokens at a time."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    if window_examples < 1 or block_examples < 1:
        raise ValueError(f"window_examples and block_examples must be positive, got {window_examples}, "
                         f"{block_examples}")
    limit = window_examples * seq_len
    window: list = []
    held = 0
    for doc_id, tokens in documents:
        window.append((doc_id, tokens))
        held += tokens.size
        if held >= limit:
            yield from _pack_window(window, seq_len, pad_id, block_examples)
            window, held = [], 0
    if window:
        yield from _pack_window(window, seq_len, pad_id, block_examples)


def pieces_of(length: int, seq_len: int) -> int:
    """How many pieces best-fit cuts a document of `length` tokens into: one when it fits, else ceil."""
    return -(-length // seq_len)
