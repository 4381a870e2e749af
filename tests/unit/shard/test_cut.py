"""transforms/shard/cut.py and tokenize_unit.py: a file cut in memory (InputCutter, tokenized as it is cut) gives
the chunks, units and unit files that the spilled cut (cut_input_file, then tokenize_chunk from its chunk files)
gives."""
from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import sentencepiece as spm

from tests.corpus_fixtures import good_documents, pile_line, write_zst
from transforms.shard import cut, tokenize_unit


def test_cutting_in_memory_gives_the_spilled_splits_chunks_units_and_files(tiny_tokenizer, tmp_path):
    docs = good_documents(200_000, doc_chars=1500)
    lines = [pile_line(text, source) for text, source in docs]
    lines[7] = b'{"text": "cut short'  # a dead letter of the tokenize stage
    lines[20] = b"x" * 5000  # over max_line_bytes: a dead letter of the split
    path = str(tmp_path / "in.jsonl.zst")
    write_zst(pathlib.Path(path), lines)
    settings = tokenize_unit.TokenizeSettings("text", ("meta.pile_set_name",), 0.2, 0.2, 0)
    sp = spm.SentencePieceProcessor(model_file=tiny_tokenizer)

    spilled_root, memory_root = tmp_path / "spilled", tmp_path / "memory"
    split = cut.cut_input_file(3, path, str(spilled_root / "stage"), str(spilled_root / "data"), 40_000, 4096)
    spilled_units = [tokenize_unit.tokenize_chunk(c, sp, np.dtype("<u2"), settings, str(spilled_root / "stage"),
                                                  str(spilled_root / "data")) for c in split.chunks]

    cutter = cut.InputCutter(3, path, 40_000, 4096)
    memory_units = [tokenize_unit.tokenize_records(ref, records, sp, np.dtype("<u2"), settings,
                                                   str(memory_root / "stage"), str(memory_root / "data"))
                    for ref, records in cutter.chunks()]
    in_memory = cutter.finish(str(memory_root / "data"), list(cutter.refs), spilled=False)

    assert len(split.chunks) > 3 and split.spilled and not in_memory.spilled
    assert [dataclasses.replace(c, chunk_path="") for c in split.chunks] == in_memory.chunks
    assert in_memory.stats == split.stats and in_memory.stats.dead_lettered == {"line_too_long": 1}
    assert pathlib.Path(in_memory.dead_letter_path.replace(str(memory_root), str(spilled_root))).read_bytes() == \
        pathlib.Path(split.dead_letter_path).read_bytes()
    assert not (memory_root / "stage" / "chunks").exists()  # nothing spilled
    assert sum(sum(u.stats.dead_lettered.values()) for u in memory_units) == 1

    def relocated(unit, root):
        paths = {f.name: getattr(unit, f.name) for f in dataclasses.fields(unit)
                 if f.name.endswith("_path") and getattr(unit, f.name)}
        return dataclasses.replace(unit, **{k: v.replace(str(root), "ROOT") for k, v in paths.items()}), paths

    for spilled_unit, memory_unit in zip(spilled_units, memory_units, strict=True):
        (a, a_paths), (b, b_paths) = relocated(spilled_unit, spilled_root), relocated(memory_unit, memory_root)
        assert a == b
        for name in a_paths:  # index, tokens, dead letters: the same bytes
            assert pathlib.Path(a_paths[name]).read_bytes() == pathlib.Path(b_paths[name]).read_bytes()
