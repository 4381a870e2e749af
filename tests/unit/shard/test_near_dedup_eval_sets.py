"""pipeline/shard/near_dedup/eval_sets.py: --decontaminate's evaluation files - matched and sorted, a glob matching
nothing refused (exit 2), a line that is not JSON refused naming the file, the texts of jsonl and jsonl.gz read the
same, and the manifest's name of a file its base name."""
from __future__ import annotations

import gzip
import json

import pytest

from pipeline.config import ShardConfig
from pipeline.errors import ConfigError
from pipeline.shard.near_dedup import eval_sets


def _config(*globs, field="q"):
    return ShardConfig(inputs=("x",), output="o", tokenizer="t", decontaminate=tuple(globs),
                       decontaminate_field=field, decontaminate_ngram=3)


def test_files_are_matched_sorted_once_and_a_glob_matching_nothing_is_a_config_error(tmp_path):
    for n in ("b.jsonl", "a.jsonl"):
        (tmp_path / n).write_text('{"q": "x"}\n')
    files = eval_sets.eval_files(_config(str(tmp_path / "*.jsonl"), str(tmp_path / "a.jsonl")))
    assert files == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    with pytest.raises(ConfigError, match=r"--decontaminate: .*none\*\.jsonl matches no file"):
        eval_sets.eval_files(_config(str(tmp_path / "none*.jsonl")))


def test_texts_of_plain_and_gzip_files_are_the_same_and_the_set_holds_their_ngrams(tmp_path):
    lines = [{"q": "the quick brown fox jumps"}, {"q": 7}, {"other": "x"}, {"q": "lazy dogs sleep all day"}]
    body = "".join(json.dumps(r) + "\n" for r in lines).encode()
    (tmp_path / "e.jsonl").write_bytes(body)
    (tmp_path / "e.jsonl.gz").write_bytes(gzip.compress(body))
    plain = list(eval_sets.eval_texts(str(tmp_path / "e.jsonl"), "q"))
    assert plain == ["the quick brown fox jumps", "lazy dogs sleep all day"]  # non-strings and misses skipped
    assert list(eval_sets.eval_texts(str(tmp_path / "e.jsonl.gz"), "q")) == plain
    config = _config(str(tmp_path / "e.jsonl"))
    eval_set = eval_sets.load_eval_set(config, eval_sets.eval_files(config))
    assert eval_set.size == 3 + 3 and eval_set.n == 3  # 5 words: 3 trigrams each


def test_a_line_that_is_not_json_is_refused_naming_the_file_and_names_are_base_names(tmp_path):
    (tmp_path / "e.jsonl").write_bytes(b'{"q": "ok"}\n' + b"x" * 64 + b"\n")
    with pytest.raises(ValueError, match=r"e\.jsonl: a line is not JSON"):
        list(eval_sets.eval_texts(str(tmp_path / "e.jsonl"), "q"))
    assert eval_sets.name("s3://bucket/evals/e.jsonl") == "e.jsonl"
    assert eval_sets.name("/data/evals/") == "evals"
