"""transforms/shard/exact_dedup.py: the one global dedup step (index_held_out_ids) reads each unit's held-out
rows, and lists the ids a full scan of every index would."""
from __future__ import annotations

import dataclasses

import numpy as np
import sentencepiece as spm

from tests.corpus_fixtures import good_documents, pile_line, write_zst
from transforms.shard import cut, doc_ids, exact_dedup, spill, tokenize_unit


def test_the_held_out_pass_reads_exactly_each_units_val_and_test_rows(tiny_tokenizer, tmp_path):
    """Tokenize records where a unit's held-out rows start; the global dedup pass reads from there (one read)
    and must list the same ids as a full scan of every index."""
    docs = good_documents(300_000, doc_chars=1500)
    write_zst(tmp_path / "in.jsonl.zst", [pile_line(text, source) for text, source in docs])
    split = cut.cut_input_file(0, str(tmp_path / "in.jsonl.zst"), str(tmp_path / "stage"),
                               str(tmp_path / "data"), 60_000, 1 << 20)
    settings = tokenize_unit.TokenizeSettings("text", ("meta.pile_set_name",), 0.2, 0.2, 0)
    sp = spm.SentencePieceProcessor(model_file=tiny_tokenizer)
    units = [tokenize_unit.tokenize_chunk(c, sp, np.dtype("<u2"), settings, str(tmp_path / "stage"),
                                          str(tmp_path / "data")) for c in split.chunks]
    assert len(units) > 1 and all(u.held_out_start is not None for u in units)
    want = {1: set(), 2: set()}
    for u in units:
        rows = np.fromfile(u.index_path, dtype=spill.INDEX_DTYPE)
        for s in want:
            want[s] |= set(rows["doc_id"][(rows["key"] >> np.uint64(62)) == s].tolist())
    assert want[1] and want[2]
    for variant in (units, [dataclasses.replace(u, held_out_start=None) for u in units]):  # recorded / searched
        dedup = exact_dedup.index_held_out_ids(variant, str(tmp_path / "stage"))
        got = {s: set(doc_ids.read_sorted_ids(path).tolist()) for s, path in dedup.held_out}
        assert got == want
