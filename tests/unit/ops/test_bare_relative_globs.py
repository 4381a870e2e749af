"""A relative input glob with no directory part (`c*.jsonl`) matches like `./c*.jsonl` (pipeline/ops/input_checks.py
match_input): Beam's local filesystem lists nothing for it, so `shard --input 'c*.jsonl'` and
`tokenizer train --input 'c*.jsonl'` failed with "matches nothing" (docs/wip/hostile-review-issue28.md F8)."""
from __future__ import annotations

import pytest

from pipeline.ops import incremental
from pipeline.ops.input_checks import match_input
from tests.corpus_fixtures import good_documents, pile_line


@pytest.fixture
def corpus_dir(tmp_path, monkeypatch):
    """Two small jsonl inputs and an unrelated file in the working directory, plus one in a subdirectory."""
    docs = good_documents(40_000)
    (tmp_path / "c1.jsonl").write_bytes(b"".join(pile_line(t, s) for t, s in docs[0::2]))
    (tmp_path / "c2.jsonl").write_bytes(b"".join(pile_line(t, s) for t, s in docs[1::2]))
    (tmp_path / "other.txt").write_bytes(b"not an input")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c3.jsonl").write_bytes(pile_line(*docs[0]))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("pattern, expected", [
    ("c*.jsonl", ["c1.jsonl", "c2.jsonl"]),
    ("c?.jsonl", ["c1.jsonl", "c2.jsonl"]),
    ("[c]1.jsonl", ["c1.jsonl"]),
    ("*/c*.jsonl", ["sub/c3.jsonl"]),
    ("./c*.jsonl", ["./c1.jsonl", "./c2.jsonl"]),  # the form written is the form recorded
    ("sub/c*.jsonl", ["sub/c3.jsonl"]),
    ("c1.jsonl", ["c1.jsonl"]),
])
def test_a_relative_glob_matches_what_the_shell_would(corpus_dir, pattern, expected):
    assert sorted(m.path for m in match_input(pattern)) == expected
    assert [r["path"] for r in incremental.list_inputs([pattern])] == expected


def test_an_absolute_glob_is_unchanged(corpus_dir):
    assert sorted(m.path for m in match_input(str(corpus_dir / "c*.jsonl"))) == \
        [str(corpus_dir / "c1.jsonl"), str(corpus_dir / "c2.jsonl")]
