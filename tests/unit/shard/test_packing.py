"""Packing: exact lengths, documents split never truncated, padding only at the end, provenance per piece."""
import dataclasses

import numpy as np
import pytest

from model_contract.example_codec import PieceColumn
from transforms.shard.packing import pack_blocks


def pack_documents(documents, seq_len: int, pad_id: int):
    """Examples one at a time, as the trainer reads them: every example of every block of `pack_blocks`."""
    for block in pack_blocks(documents, seq_len, pad_id):
        for e in range(block.examples):
            yield block.example(e)


def docs_of(lengths, eos=3):
    out = []
    for i, n in enumerate(lengths):
        toks = np.arange(100 * i + 10, 100 * i + 10 + n - 1, dtype=np.int64)
        out.append((1000 + i, np.append(toks, eos)))
    return out


@pytest.mark.parametrize("lengths,seq_len", [([5, 3, 9, 1, 20], 8), ([8, 8], 8), ([1], 4), ([50], 7)])
def test_pack_reconstructs_every_document(lengths, seq_len):
    docs = docs_of(lengths)
    examples = list(pack_documents(docs, seq_len, pad_id=0))
    total = sum(lengths)
    assert len(examples) == -(-total // seq_len)
    assert all(e.input_ids.shape == (seq_len,) for e in examples)
    assert [e.padding for e in examples[:-1]] == [0] * (len(examples) - 1)
    assert examples[-1].padding == len(examples) * seq_len - total
    pieces = {}
    for e in examples:
        for seg, (doc, off) in enumerate(zip(e.piece_doc_ids, e.piece_offsets), start=1):
            mask = e.segment_ids == seg
            assert (e.positions[mask] == np.arange(mask.sum())).all()
            pieces.setdefault(int(doc), []).append((int(off), e.input_ids[mask]))
        pad = e.segment_ids == 0
        assert (e.input_ids[pad] == 0).all() and (e.positions[pad] == 0).all()
    for doc_id, tokens in docs:
        parts = sorted(pieces[doc_id], key=lambda p: p[0])
        assert (np.concatenate([p[1] for p in parts]) == tokens).all()
        offsets = [p[0] for p in parts]
        assert offsets == list(np.cumsum([0] + [len(p[1]) for p in parts[:-1]]))


def test_segment_ids_count_pieces_in_example():
    ex = next(pack_documents(docs_of([2, 2, 2]), 6, pad_id=0))
    assert ex.segment_ids.tolist() == [1, 1, 2, 2, 3, 3]


def _reference_examples(documents, seq_len, pad_id):
    """The packing rule written the obvious way, one piece at a time (what pack_blocks vectorises):
    [(input_ids, segment_ids, positions, piece_doc_ids, piece_offsets)] per example, as lists."""
    examples, current = [], None
    for doc_id, tokens in documents:
        offset = 0
        while offset < len(tokens):
            if current is None:
                current = [[], [], [], [], []]
            take = min(seq_len - len(current[0]), len(tokens) - offset)
            current[0].extend(int(t) for t in tokens[offset:offset + take])
            current[1].extend([len(current[3]) + 1] * take)
            current[2].extend(range(take))
            current[3].append(doc_id)
            current[4].append(offset)
            offset += take
            if len(current[0]) == seq_len:
                examples.append(current)
                current = None
    if current is not None:
        pad = seq_len - len(current[0])
        current[0].extend([pad_id] * pad)
        current[1].extend([0] * pad)
        current[2].extend([0] * pad)
        examples.append(current)
    return examples


@pytest.mark.parametrize("block_examples", [1, 2, 3, 64])
def test_blocks_pack_exactly_as_the_one_piece_at_a_time_rule(block_examples):
    """Random documents (one token to several examples long, uint16 and int64 ids) against the reference rule,
    with blocks small enough that documents cross blocks and one document spans several."""
    from transforms.shard.packing import pack_blocks

    rng = np.random.default_rng(block_examples)
    for seq_len in (1, 5, 16):
        lengths = rng.integers(1, 4 * seq_len + 3, 40)
        docs = [(int(rng.integers(-2 ** 62, 2 ** 62)), rng.integers(1, 60000, n).astype(np.uint16 if i % 2 else np.int64))
                for i, n in enumerate(lengths)]
        want = _reference_examples(docs, seq_len, pad_id=7)
        blocks = list(pack_blocks(docs, seq_len, pad_id=7, block_examples=block_examples))
        assert all(b.examples == block_examples and b.padding == 0 for b in blocks[:-1])
        got = [b.example(e) for b in blocks for e in range(b.examples)]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert [g.input_ids.tolist(), g.segment_ids.tolist(), g.positions.tolist(), g.piece_doc_ids.tolist(),
                    g.piece_offsets.tolist()] == w
        assert blocks[-1].padding == got[-1].padding == len(got) * seq_len - int(lengths.sum())
        for b in blocks:  # the columns frame_examples encodes are the examples' own arrays
            columns = {k: c.dense() if isinstance(c, PieceColumn) else c for k, c in b.columns().items()}
            for e in range(b.examples):
                for name, value in b.example(e).features().items():
                    values, splits = columns[name]
                    assert (values[splits[e]:splits[e + 1]] == value).all()


@pytest.mark.parametrize("seq_len, doc_len", [(7, (1, 30)), (2048, (1, 9000)), (300, (1, 3)), (20000, (5000, 40000))])
def test_segment_ids_and_positions_framed_from_piece_starts_are_the_dense_columns_bytes(seq_len, doc_len):
    """The C framer writes segment ids and positions from the pieces' starts (PieceColumn): byte for byte what it
    writes from the dense int64 arrays, and what the Python framer writes. The cases reach positions of 1, 2 and
    3 varint bytes (20000 > 2**14) and segment ids past 127 (300-token examples of 1-2 token documents)."""
    from model_contract import example_codec
    from transforms.shard.packing import pack_blocks

    if example_codec._fast is None:
        pytest.skip("model_contract._varint was not built")
    rng = np.random.default_rng(seq_len)
    docs = [(int(rng.integers(0, 2 ** 62)), rng.integers(0, 32000, int(rng.integers(*doc_len))).astype(np.uint16))
            for _ in range(300)]
    segments = 0
    for block in pack_blocks(docs, seq_len, pad_id=0, block_examples=8):
        columns = block.columns()
        dense = {k: c.dense() if isinstance(c, PieceColumn) else c for k, c in columns.items()}
        framed = example_codec.frame_examples(columns, block.examples)
        assert framed == example_codec.frame_examples(dense, block.examples)
        fast, example_codec._fast = example_codec._fast, None
        try:
            assert framed == example_codec.frame_examples(columns, block.examples)
        finally:
            example_codec._fast = fast
        segments = max(segments, int(block.segment_ids.max()))
    assert seq_len != 300 or segments > 127


def test_a_bad_piece_column_is_refused_by_the_c_framer():
    from model_contract import example_codec
    from transforms.shard.packing import pack_blocks

    if example_codec._fast is None:
        pytest.skip("model_contract._varint was not built")
    block = next(pack_blocks(docs_of([5, 9, 3]), 8, pad_id=0))
    good = block.columns()
    name = "positions"
    column = good[name]
    bad_columns = [
        dataclasses.replace(column, cuts=column.cuts[::-1].copy()),  # falling starts
        dataclasses.replace(column, real=column.real + 100),  # more real tokens than the examples hold
        dataclasses.replace(column, kind=3),
        dataclasses.replace(column, splits=column.splits[:-1].copy()),  # one example short
        dataclasses.replace(column, cuts=column.cuts + 1),  # an example that does not start a piece
        dataclasses.replace(column, cuts=np.append(column.cuts, column.real),  # a piece starting at the padding
                            splits=np.append(column.splits[:-1], column.splits[-1] + 1)),
    ]
    for bad in bad_columns:
        with pytest.raises(ValueError, match="derived column"):
            example_codec.frame_examples({**good, name: bad}, block.examples)


def test_pack_blocks_refuses_a_bad_size():
    from transforms.shard.packing import pack_blocks

    with pytest.raises(ValueError, match="seq_len"):
        list(pack_blocks(docs_of([3]), 0, pad_id=0))
    with pytest.raises(ValueError, match="block_examples"):
        list(pack_blocks(docs_of([3]), 4, pad_id=0, block_examples=0))
