"""Decontamination as pure functions: training documents that share a word n-gram with an evaluation text.

An evaluation set is one or more files (jsonl, jsonl.zst/gz or parquet) with a text field named by
`--decontaminate-field`. Every n-word window (default 13, the GPT-3 paper's choice) of every evaluation text is
hashed with the same normalisation as near-dedup (transforms/shard/near_dedup/shingling.py: lower case, `\\w+` words, so
punctuation and spacing are stripped); a document is contaminated when any of its windows' hashes is in the
set. The n-gram and the evaluation file are recorded, so every removal can be checked by hand. An evaluation
text shorter than n words contributes no n-gram (it is too short to match reliably, as in the GPT-3 paper).

The set is a sorted uint64 array (8 bytes per evaluation n-gram: ~10 M n-grams for the usual benchmarks,
80 MB) plus a parallel array naming the file, held once per worker.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Optional

import numpy as np

from transforms.shard.documents import lookup_field
from transforms.shard.near_dedup.shingling import ngram_hashes, normalised_words

DEFAULT_NGRAM = 13


@dataclass(frozen=True)
class EvalSet:
    hashes: np.ndarray  # sorted uint64 n-gram hashes
    file_idx: np.ndarray  # int32, parallel to hashes: which file (the first in `files`' order) holds it
    files: tuple[str, ...]  # evaluation file names, sorted
    n: int = DEFAULT_NGRAM

    @property
    def size(self) -> int:
        return int(self.hashes.size)


def text_ngrams(text: str, n: int = DEFAULT_NGRAM) -> tuple:
    """(words, hashes of every full n-word window); no window for a text shorter than n words."""
    words = normalised_words(text)
    if len(words) < n:
        return words, np.zeros(0, dtype=np.uint64)
    return words, ngram_hashes(words, n)


def build_eval_set(texts_by_file: Iterable[tuple], n: int = DEFAULT_NGRAM) -> EvalSet:
    """From (file name, iterable of texts) pairs; files are taken in sorted order so the set is the same
    whatever order they are listed in, and an n-gram in two files is attributed to the first."""
    items = sorted(texts_by_file, key=lambda kv: kv[0])
    hashes, owners = [], []
    for i, (_name, texts) in enumerate(items):
        for t in texts:
            _words, h = text_ngrams(t, n)
            hashes.append(h)
            owners.append(np.full(h.size, i, dtype=np.int32))
    if not hashes:
        return EvalSet(np.zeros(0, np.uint64), np.zeros(0, np.int32), tuple(k for k, _ in items), n)
    h = np.concatenate(hashes)
    o = np.concatenate(owners)
    order = np.lexsort((o, h))
    h, o = h[order], o[order]
    keep = np.ones(h.size, dtype=bool)
    keep[1:] = h[1:] != h[:-1]
    return EvalSet(h[keep], o[keep], tuple(k for k, _ in items), n)


@dataclass(frozen=True)
class Contamination:
    eval_file: str
    ngram: str


def find(text: str, eval_set: EvalSet) -> Optional[Contamination]:
    """The first n-gram (in text order) of `text` that an evaluation text holds, or None."""
    if eval_set.size == 0:
        return None
    words, h = text_ngrams(text, eval_set.n)
    if h.size == 0:
        return None
    pos = np.searchsorted(eval_set.hashes, h)
    pos[pos == eval_set.size] = 0
    hit = np.flatnonzero(eval_set.hashes[pos] == h)
    if hit.size == 0:
        return None
    i = int(hit[0])
    return Contamination(eval_set.files[int(eval_set.file_idx[pos[i]])], " ".join(words[i:i + eval_set.n]))


def iter_eval_texts(name: str, data: bytes, text_field: str) -> Iterable[str]:
    """Texts of one evaluation file's bytes (jsonl, already decompressed); records without the field, or
    whose field is not a string, are skipped: an evaluation set is reference data, not training input."""
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise ValueError(f"{name}: a line is not JSON ({e})") from None
        value = lookup_field(record, text_field) if isinstance(record, dict) else None
        if isinstance(value, str):
            yield value
