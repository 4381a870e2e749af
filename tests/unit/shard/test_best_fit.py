"""Best-fit packing: every token once, no document that fits is split, deterministic, the window bound, and the
bytes framed from its blocks decode to the same examples (what the trainer reads)."""
import io
import random

import numpy as np
import pytest

from model_contract import decode_example, frame_examples
from model_contract.tfrecord import iter_records
from transforms.shard import best_fit, packing_stats
from transforms.shard.best_fit import pack_best_fit, plan_window
from transforms.shard.packing import pack_blocks

pytestmark = pytest.mark.formats
PAD = 0


def docs_of(lengths, eos=3, ids=None):
    out = []
    for i, n in enumerate(lengths):
        toks = np.arange(100 * i + 10, 100 * i + 10 + n - 1, dtype=np.int64)
        out.append((ids[i] if ids else 1000 + i, np.append(toks, eos).astype(np.uint16)))
    return out


def examples_of(blocks):
    return [b.example(e) for b in blocks for e in range(b.examples)]


def rebuild(examples, seq_len):
    """{doc_id: [(offset, tokens, example number)]} from the examples' provenance, checking each example."""
    pieces = {}
    for n, e in enumerate(examples):
        assert e.input_ids.shape == (seq_len,)
        for seg, (doc, off) in enumerate(zip(e.piece_doc_ids, e.piece_offsets), start=1):
            mask = e.segment_ids == seg
            assert (e.positions[mask] == np.arange(mask.sum())).all()
            pieces.setdefault(int(doc), []).append((int(off), e.input_ids[mask], n))
        pad = e.segment_ids == 0
        assert pad.sum() == e.padding and (e.input_ids[pad] == PAD).all() and (e.positions[pad] == 0).all()
        if e.padding:  # padding only at the example's end
            assert (e.segment_ids[seq_len - e.padding:] == 0).all()
    return pieces


def random_lengths(seed, n=300, seq_len=64):
    rng = random.Random(seed)
    return [rng.choice([rng.randint(1, seq_len), rng.randint(1, 4 * seq_len), seq_len]) for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("window", [1, 7, 10_000])
def test_every_token_once_and_no_fitting_document_split(seed, window):
    seq_len = 64
    docs = docs_of(random_lengths(seed, seq_len=seq_len))
    examples = examples_of(pack_best_fit(docs, seq_len, PAD, window_examples=window, block_examples=5))
    pieces = rebuild(examples, seq_len)
    assert sorted(pieces) == sorted(d for d, _ in docs)
    for doc_id, tokens in docs:
        parts = pieces[doc_id]
        assert [p[0] for p in parts] == sorted(p[0] for p in parts)  # a document's pieces come in offset order
        assert np.array_equal(np.concatenate([p[1] for p in parts]), tokens)  # every token once, in order
        assert len(parts) == best_fit.pieces_of(tokens.size, seq_len)
        if tokens.size <= seq_len:
            assert len(parts) == 1  # a document that fits is never split
        else:  # full-length pieces first, then the remainder
            assert all(p[1].size == seq_len for p in parts[:-1])
    real = sum(t.size for _, t in docs)
    assert sum(e.padding for e in examples) == len(examples) * seq_len - real


def test_best_fit_decreasing_fills_the_tightest_example():
    # 6, 5, 4, 3, 2 into examples of 8: 6 opens #0, 5 opens #1, 4 opens #2, 3 goes to #1 (room 3, the tightest
    # that holds it), 2 goes to #0 (room 2).
    plan = plan_window([4, 2, 6, 3, 5], [10, 11, 12, 13, 14], 8)
    assert [[i for i, _o, _n in ex] for ex in plan] == [[2, 1], [4, 3], [0]]
    # ties by document id, not by arrival: equal lengths are placed lowest id first
    plan = plan_window([3, 3, 3], [9, 7, 8], 4)
    assert [[i for i, _o, _n in ex] for ex in plan] == [[1], [2], [0]]
    # a long document: two full-length examples first, its remainder placed like any other document
    plan = plan_window([19, 5], [1, 2], 8)
    assert plan == [[(0, 0, 8)], [(0, 8, 8)], [(1, 0, 5), (0, 16, 3)]]


def test_deterministic_whatever_the_tokens_dtype():
    seq_len = 32
    docs = docs_of(random_lengths(5, n=200, seq_len=seq_len))
    first = [frame_examples(b.columns(), b.examples) for b in pack_best_fit(docs, seq_len, PAD, 16)]
    wide = [(d, t.astype(np.int64)) for d, t in docs]
    second = [frame_examples(b.columns(), b.examples) for b in pack_best_fit(wide, seq_len, PAD, 16)]
    assert first == second


def test_window_bounds_what_is_held():
    """No window plans more than window_examples * seq_len tokens plus the document that crossed it."""
    seq_len, window = 16, 4
    lengths = random_lengths(3, n=100, seq_len=seq_len)
    seen = []
    original = best_fit.plan_window

    def spy(window_lengths, doc_ids, s):
        seen.append(list(window_lengths))
        return original(window_lengths, doc_ids, s)

    best_fit.plan_window = spy
    try:
        list(pack_best_fit(docs_of(lengths), seq_len, PAD, window_examples=window))
    finally:
        best_fit.plan_window = original
    assert sum(len(w) for w in seen) == len(lengths) and len(seen) > 1
    for w in seen:
        assert sum(w[:-1]) < window * seq_len


def test_framed_blocks_decode_to_the_examples():
    """The shard stage frames a block's columns (one C call); the trainer decodes records with
    model_contract.decode_example: the same features as the block's examples."""
    seq_len = 24
    docs = docs_of(random_lengths(7, n=60, seq_len=seq_len))
    blocks = list(pack_best_fit(docs, seq_len, PAD, window_examples=8, block_examples=3))
    framed = b"".join(frame_examples(b.columns(), b.examples) for b in blocks)
    decoded = [decode_example(r) for r in iter_records(io.BytesIO(framed))]
    examples = examples_of(blocks)
    assert len(decoded) == len(examples)
    for d, e in zip(decoded, examples):
        for name, value in e.features().items():
            assert np.array_equal(d[name], value), name


def test_splits_fewer_documents_than_concat():
    seq_len = 64
    docs = docs_of(random_lengths(11, n=400, seq_len=seq_len))

    def fitting_split(examples):
        pieces = rebuild(examples, seq_len)
        return sum(1 for d, t in docs if t.size <= seq_len and len(pieces[d]) > 1)

    concat = fitting_split(examples_of(pack_blocks(docs, seq_len, PAD)))
    assert concat > 10 and fitting_split(examples_of(pack_best_fit(docs, seq_len, PAD))) == 0


@pytest.mark.parametrize("packing", ["concat", "best-fit"])
def test_packing_stats_count_the_pieces_the_packer_made(packing):
    seq_len = 32
    docs = docs_of(random_lengths(13, n=150, seq_len=seq_len))
    examples = (examples_of(pack_blocks(docs, seq_len, PAD)) if packing == "concat"
                else examples_of(pack_best_fit(docs, seq_len, PAD)))
    pieces = rebuild(examples, seq_len)
    stats, position = {}, 0
    for _d, t in docs:
        packing_stats.add(stats, "src", t.size, packing_stats.pieces_of(packing, position, t.size, seq_len), seq_len)
        position += t.size
    s = stats["src"]
    assert s["pieces"] == sum(len(p) for p in pieces.values())
    assert s["split"] == sum(1 for p in pieces.values() if len(p) > 1)
    assert s["fitting_split"] == sum(1 for d, t in docs if t.size <= seq_len and len(pieces[d]) > 1)
