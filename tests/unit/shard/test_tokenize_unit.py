"""transforms/shard/tokenize_unit.py, called directly: one chunk's records -> one unit, its index sorted by the
seeded key, every record read settled (tokenized or dead-lettered with its line), its tokens those of the
tokenizer."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import sentencepiece as spm

from tests.corpus_fixtures import pile_line
from transforms.shard import spill, tokenize_unit
from transforms.shard.records import ChunkRef, UnitResult

TEXTS = ["def f(x):\n    return x\n", "import os\nprint(os.sep)\n", "class A:\n    pass\n", "x = [1, 2, 3]\n"]


def _unit(tiny_tokenizer, tmp_path, records) -> tuple:
    sp = spm.SentencePieceProcessor(model_file=tiny_tokenizer)
    settings = tokenize_unit.TokenizeSettings("text", ("meta.pile_set_name",), 0.25, 0.25, 7)
    chunk = ChunkRef(2, "in.jsonl", 5, "", len(records), sum(len(d) for _, d in records))
    unit = tokenize_unit.tokenize_records(chunk, iter(records), sp, np.dtype("<u2"), settings,
                                          str(tmp_path / "stage"), str(tmp_path / "data"))
    return sp, unit


def test_a_chunk_becomes_one_sorted_unit_with_every_record_settled(tiny_tokenizer, tmp_path):
    records = [(i + 1, pile_line(t, "Docs")) for i, t in enumerate(TEXTS)] + [(9, b'{"text": "cut short')]
    sp, unit = _unit(tiny_tokenizer, tmp_path, records)
    assert unit.name == "f000002-c00005" and (unit.file_idx, unit.input_path) == (2, "in.jsonl")
    assert unit.n_docs == len(TEXTS) and unit.stats.read == len(records)
    assert unit.stats.settled() == 1 and unit.stats.dead_lettered == {"invalid_json": 1}  # written: at pack
    (dead,) = [json.loads(line) for line in open(unit.dead_letter_path)]
    assert (dead["line"], dead["reason"]) == (9, "invalid_json")
    index = np.fromfile(unit.index_path, dtype=spill.INDEX_DTYPE)
    assert index["key"].tolist() == sorted(index["key"].tolist())
    tokens = np.fromfile(unit.tokens_path, dtype=np.uint16)
    for row in index:  # each row's tokens are its document's, in the unit's tokens file
        got = tokens[row["token_start"]:row["token_start"] + row["n_tokens"]].tolist()
        assert got == sp.encode(TEXTS[row["line"] - 1])
    assert sum(unit.split_tokens) == int(index["n_tokens"].sum()) + unit.n_docs  # + one EOS each
    assert unit.sources == ["Docs"]


def test_a_chunk_that_lost_records_is_refused(tiny_tokenizer, tmp_path):
    sp = spm.SentencePieceProcessor(model_file=tiny_tokenizer)
    settings = tokenize_unit.TokenizeSettings("text", ("meta.pile_set_name",), 0.0, 0.0, 0)
    chunk = ChunkRef(0, "in.jsonl", 0, "chunk.rec.zst", 3, 10)  # the cut wrote 3, the spill holds 1
    with pytest.raises(IOError, match="holds 1 records, the cut stage wrote 3"):
        tokenize_unit.tokenize_records(chunk, iter([(1, pile_line("a b", "Docs"))]), sp, np.dtype("<u2"),
                                       settings, str(tmp_path / "stage"), str(tmp_path / "data"))


def test_spot_check_totals_sum_the_units_counts():
    units = [UnitResult.__new__(UnitResult) for _ in range(3)]
    for u, counts in zip(units, ({"documents": 2, "bytes": 10}, {"documents": 1}, {})):
        u.spot_checked = counts
    assert tokenize_unit.spot_check_totals(units) == {"documents": 3, "bytes": 10}


def test_a_re_executed_unit_leaves_one_copy_of_each_file_with_the_same_bytes(tiny_tokenizer, tmp_path):
    """Spark and Flink re-execute a bundle (a killed SDK worker, a recomputed stage): the unit's files are named
    after its chunk and written under temp names then renamed (transforms/io/io_utils.py open_write), so a second
    attempt replaces the first's files with equal bytes, and the pack stage, which reads units by name, sees one
    copy. A killed attempt's temp file is no unit file (pipeline/ops/commit.py remove_temp_files)."""
    records = [(i + 1, pile_line(t, "Docs")) for i, t in enumerate(TEXTS)]
    _sp, first = _unit(tiny_tokenizer, tmp_path, records)
    before = {p: p.read_bytes() for p in sorted((tmp_path / "stage").rglob("*")) if p.is_file()}
    killed = pathlib.Path(first.tokens_path).with_name(f".{pathlib.Path(first.tokens_path).name}.0123456789ab.part")
    killed.write_bytes(b"half a tokens file")
    _sp, second = _unit(tiny_tokenizer, tmp_path, records)
    assert second == first  # the same unit: names, counts and paths
    after = {p: p.read_bytes() for p in sorted((tmp_path / "stage").rglob("*")) if p.is_file() and p != killed}
    assert after == before
    assert killed.name not in {pathlib.Path(second.index_path).name, pathlib.Path(second.tokens_path).name}
