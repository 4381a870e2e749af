"""Shingles: the hashed n-grams near-dedup's Jaccard is over.

- Word shingles (the default): word 5-grams of normalised text (lower case, `\\w+` words, so whitespace,
  punctuation and case changes do not matter), each hashed to 64 bits with a fixed (not per-process) hash, so
  signatures are the same on every machine and runner. A document shorter than 5 words is one shingle of all
  its words. ASCII text is read straight from its bytes; with the C extension (hashing.fast) in one C pass.
- Token shingles (`--near-dedup-shingles tokens`): token 5-grams of the ids the tokenize stage wrote.
Decontamination (transforms/shard/decontaminate.py) uses the same normalisation and n-gram hashes.
"""
from __future__ import annotations

import re

import numpy as np

from transforms.shard.near_dedup import hashing
from transforms.shard.near_dedup.hashing import GOLDEN, mix

SHINGLE_WORDS = 5
SHINGLE_KINDS = ("words", "tokens")
DEFAULT_SHINGLES = "words"
SHINGLE_TOKENS = 5  # token n-gram length of --near-dedup-shingles tokens (measured: docs/NEAR_DEDUP.md)

_WORD = re.compile(r"\w+")
_NON_WORD = re.compile(r"\W+")


def normalised_words(text: str) -> list:
    """Lower-cased `\\w+` words: what near-dedup and decontamination compare (punctuation and spacing dropped)."""
    return _WORD.findall(text.lower())


def _powers(n: int) -> np.ndarray:
    out = np.ones(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for i in range(1, n):
            out[i] = out[i - 1] * _FNV_PRIME
    return out


_FNV_PRIME = np.uint64(0x100000001B3)
_POWERS = _powers(1024)  # a word's bytes past the 1024th share the last power (still a fixed hash)


def _word_hashes(words: list) -> np.ndarray:
    """A stable 64-bit hash per word (not Python's hash(), which is randomised per process): a polynomial of
    the word's UTF-8 bytes mod 2^64, its length mixed in, then splitmix64's finaliser. Computed for all words of
    a text at once in numpy (the words joined by spaces, which `\\w+` words never hold): a blake2b call per
    distinct word, the Python loop it needs, cost 2.5x as much CPU (docs/NEAR_DEDUP.md "Cost")."""
    return _joined_word_hashes(" ".join(words))


def _joined_word_hashes(joined: str) -> np.ndarray:
    """`_word_hashes` of words given joined by single spaces (no leading or trailing space)."""
    if not joined:
        return np.zeros(0, dtype=np.uint64)
    buf = np.frombuffer(joined.encode("utf-8"), dtype=np.uint8)
    starts = np.concatenate(([0], np.flatnonzero(buf == 32) + 1))
    lengths = np.diff(np.concatenate((starts, [buf.size + 1]))) - 1  # bytes per word, separator excluded
    pos = np.arange(buf.size) - np.repeat(starts, lengths + 1)[:buf.size]  # byte position inside its word
    with np.errstate(over="ignore"):
        terms = (buf.astype(np.uint64) + np.uint64(1)) * _POWERS[np.minimum(pos, _POWERS.size - 1)]
        terms[buf == 32] = 0
        h = np.add.reduceat(terms, starts)
        return mix(h ^ (lengths.astype(np.uint64) << np.uint64(48)))


def ngram_hashes(words: list, n: int) -> np.ndarray:
    """64-bit hash of every n-word window, in text order (a text shorter than n words: one hash of all)."""
    return _window_hashes(_word_hashes(words), n)


def _window_hashes(w: np.ndarray, n: int, mix_each: bool = True) -> np.ndarray:
    """Hash of every n-element window of per-element hashes `w`: h = n, then h = h * golden + w[i] per element,
    mod 2^64 (order matters: "a b" != "b a"). Words: splitmix64's finaliser after each element (the values
    every committed word band index holds). Tokens (`mix_each=False`): the finaliser once at the end, two array
    operations per element instead of ~9, 4x less CPU on 4M tokens (docs/NEAR_DEDUP.md "Token shingles"); the
    per-token mix before keeps the sum's inputs uniform."""
    if w.size == 0:
        return w
    n = min(n, w.size)
    count = w.size - n + 1
    h = np.full(count, np.uint64(n), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(n):
            if mix_each:
                h = mix(h * GOLDEN + w[k:k + count])
            else:
                h *= GOLDEN
                h += w[k:k + count]
    return h if mix_each else mix(h)


# ASCII bytes: which are `\w` (for ASCII characters exactly [0-9A-Za-z_]) and each one's lower case
_ASCII_WORD = np.zeros(256, dtype=bool)
for _c in b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_":
    _ASCII_WORD[_c] = True
_ASCII_LOWER = np.arange(256, dtype=np.uint64)
_ASCII_LOWER[ord("A"):ord("Z") + 1] += np.uint64(32)


def _ascii_word_hashes(text: str) -> np.ndarray:
    """`_joined_word_hashes` of an ASCII text's normalised words, straight from its bytes: `str.lower()` and the
    `\\W+` substitution were half the cost of shingling (docs/NEAR_DEDUP.md "Cost"); for ASCII text they are a
    byte table lookup, so the words' bytes, positions and lengths come from one mask."""
    return _ascii_words(text)[0]


def _ascii_words(text: str) -> tuple:
    """(word hashes, word start offsets in the text) of an ASCII text."""
    buf = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    word = np.take(_ASCII_WORD, buf)
    if not word.any():
        return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
    edges = np.flatnonzero(np.diff(np.concatenate(([False], word, [False])).view(np.int8)))
    starts, ends = edges[0::2], edges[1::2]  # word runs [start, end) in the text
    lengths = ends - starts
    cstarts = np.concatenate(([0], np.cumsum(lengths)[:-1]))  # the runs' starts among the word bytes only
    pos = np.arange(int(lengths.sum()), dtype=np.int32) - np.repeat(cstarts.astype(np.int32), lengths)
    if int(lengths.max()) > _POWERS.size:
        pos = np.minimum(pos, _POWERS.size - 1)
    with np.errstate(over="ignore"):
        terms = np.take(_ASCII_LOWER_PLUS_1, buf[word]) * np.take(_POWERS, pos)
        h = np.add.reduceat(terms, cstarts)
        return mix(h ^ (lengths.astype(np.uint64) << np.uint64(48))), starts


_ASCII_LOWER_PLUS_1 = _ASCII_LOWER + np.uint64(1)


def _sorted_unique(h: np.ndarray) -> np.ndarray:
    h = np.sort(h)
    # a sort and a neighbour compare, not np.unique (docs/BENCHMARKS.md, "Near-dedup")
    return h[np.concatenate(([True], h[1:] != h[:-1]))] if h.size else h


def shingles_batch(texts: list, n: int = SHINGLE_WORDS) -> list:
    """`shingles` of each text, the same arrays, computed together. With the C extension (`_shingles.c`) the
    ASCII texts' windows come from one C pass and each text's slice is sorted here; a non-ASCII text takes the
    Python path (`python_shingles`: Unicode lower() and `\\w`). Without it, `_shingles_batch_numpy`."""
    if hashing.fast is None:
        return _shingles_batch_numpy(texts, n)
    texts = list(texts)
    flat, counts = c_windows(texts, n)
    out: list = [None] * len(texts)
    at = 0
    for i, c in enumerate(counts.tolist()):
        if c < 0:
            out[i] = python_shingles(texts[i], n)
        else:
            out[i] = _sorted_unique(flat[at:at + c])
            at += c
    return out


def c_windows(texts: list, n: int) -> tuple:
    """(window hashes of the ASCII texts, uint64; count per text, int64, -1 for a non-ASCII text) by the C
    extension: the values of `_ascii_words` + `_window_hashes`, unsorted, repeats kept."""
    flat, counts = hashing.fast.windows(texts, n)
    return np.frombuffer(flat, dtype="<u8"), np.frombuffer(counts, dtype="<i8")


def _shingles_batch_numpy(texts: list, n: int = SHINGLE_WORDS) -> list:
    """`shingles_batch` without the C extension: the ASCII texts joined by a space (a non-word, so no word spans
    two texts) get their word hashes and window hashes in one pass each, and each text's windows are the slice
    that lies inside it; per-text numpy calls (five mixes per window position) were a third of shingling on
    ~5 kB documents (docs/NEAR_DEDUP.md "Cost")."""
    out: list = [None] * len(texts)
    ascii_at = [i for i, t in enumerate(texts) if t.isascii()]
    for i, t in enumerate(texts):
        if not t.isascii():
            out[i] = python_shingles(t, n)
    if not ascii_at:
        return out
    joined = " ".join(texts[i] for i in ascii_at)
    w, starts = _ascii_words(joined)
    lengths = np.array([len(texts[i]) for i in ascii_at], dtype=np.int64)
    text_ends = np.cumsum(lengths + 1) - 1  # offset just past each text in `joined`
    word_ends = np.searchsorted(starts, text_ends)  # words of text k: [word_ends[k-1], word_ends[k])
    word_starts = np.concatenate(([0], word_ends[:-1]))
    count = w.size - n + 1
    windows = _window_hashes(w, n) if count > 0 else np.zeros(0, dtype=np.uint64)
    for k, i in enumerate(ascii_at):
        lo, hi = int(word_starts[k]), int(word_ends[k])
        if hi - lo >= n:
            out[i] = _sorted_unique(windows[lo:hi - n + 1])
        else:  # shorter than n words: one shingle of all of them (or none)
            out[i] = _sorted_unique(_window_hashes(w[lo:hi], n))
    return out


def shingles(text: str, n: int = SHINGLE_WORDS) -> np.ndarray:
    """Sorted unique 64-bit shingle hashes of a text (empty for a text without words). The same values as
    `ngram_hashes(normalised_words(text), n)`, without building the word list: non-word runs become one space
    (ASCII text: straight from its bytes, `_ascii_word_hashes`; with the C extension, `shingles_batch`)."""
    if hashing.fast is not None and text.isascii():
        return shingles_batch([text], n)[0]
    return python_shingles(text, n)


def python_shingles(text: str, n: int = SHINGLE_WORDS) -> np.ndarray:
    """`shingles` in numpy (non-ASCII text: Unicode `str.lower()` and `\\W+`)."""
    words = (_ascii_word_hashes(text) if text.isascii()
             else _joined_word_hashes(_NON_WORD.sub(" ", text.lower()).strip(" ")))
    return _sorted_unique(_window_hashes(words, n))


_TOKEN_SALT = np.uint64(0x746F6B656E736869)  # token hashes never equal word hashes of the same value


def token_shingles_batch(arrays: list, n: int = SHINGLE_TOKENS, unique: bool = True) -> list:
    """Token n-gram shingles of each document's token ids (the tokenize stage's int arrays): per token a
    splitmix64 mix of its id, then `_window_hashes` (one mix per window) over all documents' tokens at once, each
    document taking the windows that lie inside it (a document shorter than n tokens: one shingle of all its
    tokens, as `shingles`). No text is read or lower-cased: ids are identical across exact tokenizer backends, so the
    hashes are too. `unique=False` leaves each document's windows unsorted and repeated: one-permutation
    signatures (a minimum per bin) are the same either way, and sorting is most of this function's cost;
    exact Jaccard (--near-dedup-verify) needs the sorted unique sets."""
    out: list = [None] * len(arrays)
    sizes = np.array([len(a) for a in arrays], dtype=np.int64)
    if not len(arrays):
        return out
    ends = np.cumsum(sizes)
    starts = ends - sizes
    flat = np.concatenate([np.asarray(a) for a in arrays]).astype(np.uint64) if int(ends[-1]) else \
        np.zeros(0, dtype=np.uint64)
    w = mix(flat ^ _TOKEN_SALT)
    windows = _window_hashes(w, n, mix_each=False) if w.size >= n else np.zeros(0, dtype=np.uint64)
    finish = _sorted_unique if unique else (lambda h: h)
    for k in range(len(arrays)):
        lo, hi = int(starts[k]), int(ends[k])
        if hi - lo >= n:
            out[k] = finish(windows[lo:hi - n + 1])
        else:
            out[k] = finish(_window_hashes(w[lo:hi], n, mix_each=False))
    return out
