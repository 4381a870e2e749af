"""Packing: exact lengths, documents split never truncated, padding only at the end, provenance per piece."""
import numpy as np
import pytest

from transforms.packing import pack_documents


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
