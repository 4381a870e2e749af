"""Decontamination's pure parts (transforms/shard/decontaminate.py): normalised 13-grams against eval sets."""
from __future__ import annotations

import json

import numpy as np
import pytest

from transforms.shard import decontaminate as dc

QUESTION = ("Which of the following best describes the primary function of mitochondria in eukaryotic cells "
            "when oxygen is plentiful")


def test_a_shared_13_gram_is_found_whatever_case_and_punctuation_with_file_and_ngram():
    ev = dc.build_eval_set([("mmlu.jsonl", [QUESTION]), ("other.jsonl", ["short text"])])
    doc = "Intro text here. WHICH of the following, best describes the primary function of mitochondria in " \
          "eukaryotic cells; when oxygen..."
    hit = dc.find(doc, ev)
    assert hit == dc.Contamination("mmlu.jsonl", "which of the following best describes the primary function of "
                                                 "mitochondria in eukaryotic")
    assert dc.find("which of the following best describes the primary function of mitochondria", ev) is None


def test_eval_texts_shorter_than_n_contribute_nothing_and_files_are_ordered():
    ev = dc.build_eval_set([("b.jsonl", [QUESTION]), ("a.jsonl", [QUESTION, "too short"])])
    assert ev.files == ("a.jsonl", "b.jsonl")
    assert ev.size == len(QUESTION.split()) - 13 + 1
    assert dc.find(QUESTION, ev).eval_file == "a.jsonl"  # an n-gram in two files: the first file's
    assert np.all(np.diff(ev.hashes.astype(np.float64)) > 0)
    assert dc.find(QUESTION, dc.build_eval_set([])) is None


def test_iter_eval_texts_reads_a_dotted_field_and_refuses_non_json():
    data = b"\n".join(json.dumps(r).encode() for r in [{"q": {"text": "a"}}, {"q": {"text": 3}}, {"x": 1}])
    assert list(dc.iter_eval_texts("e.jsonl", data + b"\n\n", "q.text")) == ["a"]
    with pytest.raises(ValueError, match="e.jsonl"):
        list(dc.iter_eval_texts("e.jsonl", b"{not json", "text"))
