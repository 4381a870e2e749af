"""Near-duplicate detection as pure functions: shingles, seeded MinHash, LSH band keys, clusters, keepers.

The Beam wiring is pipeline/shard/near_dedup_graph.py; this module holds the logic so it can be tested and
benchmarked without a runner (bench/near_dedup_bench.py).

- Shingles: word 5-grams of normalised text (lower case, `\\w+` words, so whitespace, punctuation and case
  changes do not matter), each hashed to 64 bits with a fixed (not per-process) hash, so signatures are the
  same on every machine and runner. A document shorter than 5 words is one shingle of all its words.
- Signatures: `bands * rows` values per document by one-permutation hashing with optimal densification
  (`oph_signatures`, one seeded hash per shingle), or by classic MinHash with that many permutations
  (`minhash_signatures`, kept for the bench); both seeded by `seed` and computed in batch.
- LSH: a pair with Jaccard J shares at least one band with probability 1 - (1 - J^rows)^bands (`s_curve`). The
  defaults (10 bands x 10 rows) put the threshold (1/bands)^(1/rows) at 0.79: P = 0.01 at J = 0.5, 0.25 at
  0.7, 0.68 at 0.8, 0.99 at 0.9. A candidate becomes an edge only if its estimated (or, with verify, exact)
  Jaccard reaches the threshold, which is what keeps pairs below 0.7 out.
- Keeper: the rule of exact dedup (transforms/shard/documents.py `split_wins`): test over val over train, then
  the smallest document id. `rank` encodes it so that the smallest rank wins.
  Incrementally a committed document outranks every new one (`rank(..., committed=True)`).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Iterable, Optional

import numpy as np

try:  # optional C accelerator of the word-shingle path (setup.py builds it; bit-identical to the numpy path)
    from transforms.shard import _shingles as _fast
except ImportError:  # pragma: no cover - exercised where no compiler was available
    _fast = None

SHINGLE_WORDS = 5
SHINGLE_KINDS = ("words", "tokens")
DEFAULT_SHINGLES = "words"
SHINGLE_TOKENS = 5  # token n-gram length of --near-dedup-shingles tokens (measured: docs/NEAR_DEDUP.md)
DEFAULT_BANDS = 10
DEFAULT_ROWS = 10
DEFAULT_THRESHOLD = 0.8
DEFAULT_ROUNDS = 12
SKETCHES = ("oph", "minhash")
DEFAULT_SKETCH = "oph"
OPH_DONOR_ATTEMPTS = 32
SIGNATURE_DTYPE = np.dtype("<u4")

_WORD = re.compile(r"\w+")
_NON_WORD = re.compile(r"\W+")
_M64 = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def normalised_words(text: str) -> list:
    """Lower-cased `\\w+` words: what near-dedup and decontamination compare (punctuation and spacing dropped)."""
    return _WORD.findall(text.lower())


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * _MIX1
        x = x ^ (x >> np.uint64(27))
        x = x * _MIX2
        return x ^ (x >> np.uint64(31))


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
        return _mix(h ^ (lengths.astype(np.uint64) << np.uint64(48)))


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
                h = _mix(h * _GOLDEN + w[k:k + count])
            else:
                h *= _GOLDEN
                h += w[k:k + count]
    return h if mix_each else _mix(h)


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
        return _mix(h ^ (lengths.astype(np.uint64) << np.uint64(48))), starts


_ASCII_LOWER_PLUS_1 = _ASCII_LOWER + np.uint64(1)


def _sorted_unique(h: np.ndarray) -> np.ndarray:
    h = np.sort(h)
    return h[np.concatenate(([True], h[1:] != h[:-1]))] if h.size else h  # np.unique's hash path: 8x slower


def shingles_batch(texts: list, n: int = SHINGLE_WORDS) -> list:
    """`shingles` of each text, the same arrays, computed together. With the C extension (`_shingles.c`) the
    ASCII texts' windows come from one C pass and each text's slice is sorted here; a non-ASCII text takes the
    Python path (`_python_shingles`: Unicode lower() and `\\w`). Without it, `_shingles_batch_numpy`."""
    if _fast is None:
        return _shingles_batch_numpy(texts, n)
    texts = list(texts)
    flat, counts = _c_windows(texts, n)
    out: list = [None] * len(texts)
    at = 0
    for i, c in enumerate(counts.tolist()):
        if c < 0:
            out[i] = _python_shingles(texts[i], n)
        else:
            out[i] = _sorted_unique(flat[at:at + c])
            at += c
    return out


def _c_windows(texts: list, n: int) -> tuple:
    """(window hashes of the ASCII texts, uint64; count per text, int64, -1 for a non-ASCII text) by the C
    extension: the values of `_ascii_words` + `_window_hashes`, unsorted, repeats kept."""
    flat, counts = _fast.windows(texts, n)
    return np.frombuffer(flat, dtype="<u8"), np.frombuffer(counts, dtype="<i8")


def word_signatures(texts: list, params: "MinHashParams", coefficients: Optional[tuple] = None) -> np.ndarray:
    """`signatures(shingles_batch(texts), params)`, the same values: with the C extension and the default
    one-permutation sketch straight from the texts' window hashes (a bin's minimum is the same over the windows
    with repeats as over the sorted unique set, so nothing is sorted); non-ASCII texts' windows from the Python
    path. The shard job calls this when it stages no shingles (no --near-dedup-verify)."""
    if _fast is None or params.sketch != "oph":
        return signatures(shingles_batch(texts, params.shingle_words), params, coefficients)
    texts = list(texts)
    flat, counts = _c_windows(texts, params.shingle_words)
    if (counts < 0).any():  # the non-ASCII texts' shingles spliced in where their windows would be
        parts, at, fixed = [], 0, counts.copy()
        for i, c in enumerate(counts.tolist()):
            if c < 0:
                sh = _python_shingles(texts[i], params.shingle_words)
                parts.append(sh)
                fixed[i] = sh.size
            else:
                parts.append(flat[at:at + c])
                at += c
        flat = np.concatenate(parts) if parts else flat
        counts = fixed
    return _c_oph(flat, counts, params)


def _c_oph(flat: np.ndarray, counts: np.ndarray, params: "MinHashParams") -> np.ndarray:
    salt, donors = _oph_tables(params)
    out = _fast.oph(np.ascontiguousarray(flat, dtype="<u8"), np.ascontiguousarray(counts, dtype="<i8"),
                    params.num_perm, int(salt), np.ascontiguousarray(donors, dtype="<i8"))
    return np.frombuffer(out, dtype=SIGNATURE_DTYPE).reshape(len(counts), params.num_perm).copy()


def _shingles_batch_numpy(texts: list, n: int = SHINGLE_WORDS) -> list:
    """`shingles_batch` without the C extension: the ASCII texts joined by a space (a non-word, so no word spans
    two texts) get their word hashes and window hashes in one pass each, and each text's windows are the slice
    that lies inside it; per-text numpy calls (five mixes per window position) were a third of shingling on
    ~5 kB documents (docs/NEAR_DEDUP.md "Cost")."""
    out: list = [None] * len(texts)
    ascii_at = [i for i, t in enumerate(texts) if t.isascii()]
    for i, t in enumerate(texts):
        if not t.isascii():
            out[i] = _python_shingles(t, n)
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
    if _fast is not None and text.isascii():
        return shingles_batch([text], n)[0]
    return _python_shingles(text, n)


def _python_shingles(text: str, n: int = SHINGLE_WORDS) -> np.ndarray:
    """`shingles` in numpy (non-ASCII text: Unicode `str.lower()` and `\\W+`)."""
    words = (_ascii_word_hashes(text) if text.isascii()
             else _joined_word_hashes(_NON_WORD.sub(" ", text.lower()).strip(" ")))
    return _sorted_unique(_window_hashes(words, n))


_TOKEN_SALT = np.uint64(0x746F6B656E736869)  # token hashes never equal word hashes of the same value


def token_shingles_batch(arrays: list, n: int = SHINGLE_TOKENS, unique: bool = True) -> list:
    """Token n-gram shingles of each document's token ids (the tokenize stage's int arrays): per token a
    splitmix64 mix of its id, then `_window_hashes` (one mix per window) over all documents' tokens at once, each document
    taking the windows that lie inside it (a document shorter than n tokens: one shingle of all its tokens, as
    `shingles`). No text is read or lower-cased: ids are identical across exact tokenizer backends, so the
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
    w = _mix(flat ^ _TOKEN_SALT)
    windows = _window_hashes(w, n, mix_each=False) if w.size >= n else np.zeros(0, dtype=np.uint64)
    finish = _sorted_unique if unique else (lambda h: h)
    for k in range(len(arrays)):
        lo, hi = int(starts[k]), int(ends[k])
        if hi - lo >= n:
            out[k] = finish(windows[lo:hi - n + 1])
        else:
            out[k] = finish(_window_hashes(w[lo:hi], n, mix_each=False))
    return out


def token_shingles(ids, n: int = SHINGLE_TOKENS) -> np.ndarray:
    """Sorted unique token n-gram shingle hashes of one document's token ids (`token_shingles_batch`)."""
    return token_shingles_batch([ids], n)[0]


@dataclass(frozen=True)
class MinHashParams:
    bands: int = DEFAULT_BANDS
    rows: int = DEFAULT_ROWS
    seed: int = 0
    shingle_words: int = SHINGLE_WORDS
    sketch: str = DEFAULT_SKETCH
    shingles: str = DEFAULT_SHINGLES  # SHINGLE_KINDS: word 5-grams of the text or token n-grams of its ids

    @property
    def num_perm(self) -> int:
        return self.bands * self.rows

    def coefficients(self) -> tuple:
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([0x6E646475, self.seed & _M64])))
        a = rng.integers(0, 1 << 63, size=self.num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        b = rng.integers(0, 1 << 63, size=self.num_perm, dtype=np.uint64)
        return a, b


def signatures(shingle_sets: list, params: MinHashParams, coefficients: Optional[tuple] = None) -> np.ndarray:
    """(documents, num_perm) uint32 signatures of a batch of shingle arrays, computed together, by the
    params' sketch: one-permutation hashing (`oph_signatures`, the default) or `num_perm` permutations
    (`minhash_signatures`). Either way two documents agree on a position with probability = their Jaccard.

    An empty set gets all-0xFFFFFFFF (it matches only other empty texts, which have no words and never
    reach here: parse_record filters whitespace-only text, and a text of only punctuation is one such)."""
    if params.sketch == "oph":
        return oph_signatures(shingle_sets, params)
    if params.sketch != "minhash":
        raise ValueError(f"unknown sketch {params.sketch!r} (one of {', '.join(SKETCHES)})")
    return minhash_signatures(shingle_sets, params, coefficients)


def oph_signatures(shingle_sets: list, params: MinHashParams) -> np.ndarray:
    """One-permutation hashing with optimal densification (Shrivastava 2017): one seeded hash per shingle; its
    top bits pick one of `num_perm` bins, the minimum of its low 32 bits per bin is the bin's value. An empty
    bin borrows the value of the first non-empty bin along a seeded sequence of bins that depends only on the
    bin (the same for every document), so two documents still agree on a bin with probability = Jaccard.
    One hash pass instead of `num_perm` (docs/NEAR_DEDUP.md "Cost"). With the C extension, one loop over the
    shingles (`_c_oph`); else `_oph_signatures_numpy`."""
    if _fast is not None:
        sizes = np.array([len(s) for s in shingle_sets], dtype=np.int64)
        flat = (np.concatenate([np.asarray(s, dtype=np.uint64) for s in shingle_sets]) if int(sizes.sum())
                else np.zeros(0, dtype=np.uint64))
        return _c_oph(flat, sizes, params)
    return _oph_signatures_numpy(shingle_sets, params)


def _oph_signatures_numpy(shingle_sets: list, params: "MinHashParams") -> np.ndarray:
    k = params.num_perm
    out = np.full((len(shingle_sets), k), 0xFFFFFFFF, dtype=SIGNATURE_DTYPE)
    nonempty = [i for i, s in enumerate(shingle_sets) if len(s)]
    if not nonempty:
        return out
    sizes = np.array([len(shingle_sets[i]) for i in nonempty], dtype=np.int64)
    flat = np.concatenate([shingle_sets[i] for i in nonempty]).astype(np.uint64)
    salt, donors = _oph_tables(params)
    h = _mix(flat ^ salt)
    with np.errstate(over="ignore"):
        slot = np.repeat(np.arange(len(nonempty), dtype=np.uint64) * np.uint64(k), sizes) + (
            ((h >> np.uint64(32)) * np.uint64(k)) >> np.uint64(32))
    keyed = np.sort((slot << np.uint64(32)) | (h & np.uint64(0xFFFFFFFF)))  # by slot, then value: min first
    slots = keyed >> np.uint64(32)
    first = np.flatnonzero(np.concatenate(([True], slots[1:] != slots[:-1])))
    dense = np.zeros(len(nonempty) * k, dtype=SIGNATURE_DTYPE)
    filled = np.zeros(len(nonempty) * k, dtype=bool)
    dense[slots[first].astype(np.int64)] = (keyed[first] & np.uint64(0xFFFFFFFF)).astype(SIGNATURE_DTYPE)
    filled[slots[first].astype(np.int64)] = True
    dense, filled = dense.reshape(-1, k), filled.reshape(-1, k)
    rows, bins = np.nonzero(~filled)
    value = np.zeros(rows.size, dtype=SIGNATURE_DTYPE)
    todo = np.ones(rows.size, dtype=bool)
    for attempt in range(donors.shape[0]):
        if not todo.any():
            break
        d = donors[attempt, bins]
        hit = todo & filled[rows, d]
        value[hit] = dense[rows[hit], d[hit]]
        todo &= ~hit
    for i in np.flatnonzero(todo).tolist():  # rare (a document with a handful of shingles): the next filled bin
        r, b = rows[i], bins[i]
        nxt = next(j for j in list(range(b + 1, k)) + list(range(b)) if filled[r, j])
        value[i] = dense[r, nxt]
    dense[rows, bins] = value
    out[nonempty] = dense
    return out


@functools.lru_cache(maxsize=8)
def _oph_tables(params: MinHashParams) -> tuple:
    """(salt, donor bins [attempt, bin]) of one seed: the densification sequence of every bin."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([0x6F706868, params.seed & _M64])))
    salt = rng.integers(0, 1 << 63, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    donors = rng.integers(0, params.num_perm, size=(OPH_DONOR_ATTEMPTS, params.num_perm))
    donors.flags.writeable = False  # cached (one seed's tables serve every batch): shared, so read-only
    return salt, donors


def minhash_signatures(shingle_sets: list, params: MinHashParams, coefficients: Optional[tuple] = None) -> np.ndarray:
    """`num_perm` permutations h_i(x) = (a_i x + b_i) mod 2^64, top 32 bits of the minimum (the classic sketch;
    kept for the bench's side-by-side)."""
    a, b = coefficients or params.coefficients()
    out = np.full((len(shingle_sets), params.num_perm), 0xFFFFFFFF, dtype=SIGNATURE_DTYPE)
    nonempty = [i for i, s in enumerate(shingle_sets) if len(s)]
    if not nonempty:
        return out
    flat = np.concatenate([shingle_sets[i] for i in nonempty]).astype(np.uint64)
    starts = np.cumsum([0] + [len(shingle_sets[i]) for i in nonempty[:-1]])
    # permutation-major in slices of the permutations, so the temporary matrix stays ~ 32 x shingles x 8 bytes
    step = 32
    for lo in range(0, params.num_perm, step):
        hi = min(params.num_perm, lo + step)
        with np.errstate(over="ignore"):
            h = flat[None, :] * a[lo:hi, None]
            h += b[lo:hi, None]
        # the top 32 bits of the minimum are the minimum of the top 32 bits: shift after reducing (one pass less)
        mins = np.minimum.reduceat(h, starts, axis=1) >> np.uint64(32)
        out[nonempty, lo:hi] = mins.T.astype(SIGNATURE_DTYPE)
    return out


def band_keys(sigs: np.ndarray, params: MinHashParams) -> np.ndarray:
    """(documents, bands) uint64: one bucket key per band (the band's index is mixed in, so bands never meet)."""
    sigs = np.atleast_2d(sigs)
    if _fast is not None and sigs.shape[1] == params.num_perm:
        out = _fast.band_keys(np.ascontiguousarray(sigs, dtype=SIGNATURE_DTYPE), params.bands, params.rows)
        return np.frombuffer(out, dtype="<u8").reshape(sigs.shape[0], params.bands).astype(np.uint64)
    return _band_keys_numpy(sigs, params)


def _band_keys_numpy(sigs: np.ndarray, params: "MinHashParams") -> np.ndarray:
    sigs = np.atleast_2d(sigs)
    keys = np.empty((sigs.shape[0], params.bands), dtype=np.uint64)
    for band in range(params.bands):
        h = np.full(sigs.shape[0], np.uint64(band + 1), dtype=np.uint64)
        with np.errstate(over="ignore"):
            for j in range(params.rows):
                h = _mix(h * _GOLDEN + sigs[:, band * params.rows + j].astype(np.uint64))
        keys[:, band] = h
    return keys


def estimated_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """Share of equal MinHash values: an unbiased estimate of the Jaccard similarity of the shingle sets."""
    return float(np.mean(np.asarray(sig_a) == np.asarray(sig_b)))


def exact_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """|A ∩ B| / |A ∪ B| of two sorted unique shingle arrays (--near-dedup-verify); 1.0 for two empty sets."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    inter = np.intersect1d(a, b, assume_unique=True).size
    return inter / (len(a) + len(b) - inter)


def s_curve(jaccard: float, bands: int, rows: int) -> float:
    """Probability that a pair of this Jaccard similarity shares at least one band (becomes a candidate)."""
    return 1.0 - (1.0 - jaccard ** rows) ** bands


def lsh_threshold(bands: int, rows: int) -> float:
    """The Jaccard value near the S-curve's steepest point: (1 / bands) ^ (1 / rows)."""
    return (1.0 / bands) ** (1.0 / rows)


def s_curve_text(bands: int, rows: int) -> str:
    """The S-curve at a few Jaccard values, for --help and docs/NEAR_DEDUP.md."""
    points = ", ".join(f"{j:g}: {s_curve(j, bands, rows):.2f}" for j in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95))
    return f"threshold ~{lsh_threshold(bands, rows):.2f}; P(candidate | Jaccard) {points}"


# ----------------------------------------------------------------------------------------------- keepers
COMMITTED_RANK_SHIFT = 8  # more than the number of splits: any committed document outranks every new one


def rank(split: int, doc_id: int, committed: bool = False) -> tuple:
    """Keeper order: the smallest rank wins. Test (2) over val (1) over train (0), then the smallest id. A
    document of a committed generation (--incremental) outranks every new one: committed files are immutable,
    so a committed document is never removed and a new near-copy of it always loses."""
    return (-int(split) - (COMMITTED_RANK_SHIFT if committed else 0), int(doc_id))


@dataclass(frozen=True, order=True)
class Node:
    """One distinct document in the near-dedup graph (small: it travels through the runner's shuffle).

    `split` is the highest split any exact copy of it sits in (the copy exact dedup keeps); `loc` says where
    its shingles are staged (unit name, first element, count) for --near-dedup-verify. A `committed` node comes
    from a committed generation's band index (transforms/shard/near_dedup_band_index.py): its `loc` is
    ("committed", generation), it has no staged shingles or text, and it is never removed."""
    rank: tuple
    doc_id: int
    split: int
    sig: bytes
    source: str = ""
    loc: tuple = ()
    excerpt: str = ""
    committed: bool = False

    def signature(self) -> np.ndarray:
        return np.frombuffer(self.sig, dtype=SIGNATURE_DTYPE)


def merge_copies(nodes: Iterable[Node]) -> list:
    """Distinct documents of a band bucket, one Node per id: the exact copy in the highest split, then the
    smallest location (copies share text, hence signature; which copy stands for the id must not depend on
    the order the runner delivers them in)."""
    best: dict = {}
    for n in nodes:
        cur = best.get(n.doc_id)
        if cur is None or (n.rank, n.loc, n.source) < (cur.rank, cur.loc, cur.source):
            best[n.doc_id] = n
    return sorted(best.values())


def bucket_edges(nodes: Iterable[Node], threshold: float) -> list:
    """Candidate edges of one band bucket: its best-ranked document to every other member whose estimated
    Jaccard with it reaches `threshold`. A star (not all pairs) keeps a bucket linear in its size; members
    that are near each other but not near the star's centre are linked through the other bands they share."""
    members = merge_copies(nodes)
    committed = [m for m in members if m.committed]
    new = [m for m in members if not m.committed]
    if not new or len(members) < 2:
        return []
    out = []
    # Incremental: each new member links to the best-ranked committed member it is near. Committed members are
    # never linked to each other (their generation already decided them), and the new ones form their own
    # star as in a full build, so a new-vs-new cluster resolves the same way whether or not B has a committed
    # partner; label propagation then gives the whole component its best (committed) keeper.
    for m in new:
        msig = m.signature()
        for c in committed:
            j = estimated_jaccard(c.signature(), msig)
            if j >= threshold:
                out.append((c, m, j))
                break
    centre = new[0]
    csig = centre.signature()
    for m in new[1:]:
        j = estimated_jaccard(csig, m.signature())
        if j >= threshold:
            out.append((centre, m, j))
    return out


def best_label(labels: Iterable[Node]) -> Node:
    return min(labels)


def components(edges: Iterable[tuple], rounds: int = DEFAULT_ROUNDS) -> tuple:
    """Reference union-find by label propagation, the same rounds the graph runs: ({doc_id: (Node, keeper
    Node)}, converged). Each round every node takes the best label among itself and its neighbours; the graph
    has converged when a round changes nothing (rounds > the largest distance from a keeper)."""
    adjacency: dict = {}
    nodes: dict = {}
    for a, b, _j in edges:
        nodes[a.doc_id], nodes[b.doc_id] = a, b
        adjacency.setdefault(a.doc_id, set()).add(b.doc_id)
        adjacency.setdefault(b.doc_id, set()).add(a.doc_id)
    label = dict(nodes)
    converged = False
    for _ in range(rounds):
        new = {d: best_label([label[d]] + [label[m] for m in adjacency[d]]) for d in nodes}
        changed = any(new[d] != label[d] for d in nodes)
        label = new
        if not changed:
            converged = True
            break
    return {d: (nodes[d], label[d]) for d in sorted(nodes)}, converged


def removal_of(node: Node, keeper: Node) -> Optional[tuple]:
    """(removed id, keeper id, estimated Jaccard of the two) for a node whose cluster's keeper is another."""
    if keeper.doc_id == node.doc_id:
        return None
    return node.doc_id, keeper.doc_id, round(estimated_jaccard(node.signature(), keeper.signature()), 4)


def cluster_size_bins(sizes: Iterable[int]) -> dict:
    """{"2": n, "3-4": n, "5-8": n, ...}: a log2 histogram of cluster sizes (keeper included)."""
    bins: dict = {}
    for s in sizes:
        k = max(1, int(s - 1).bit_length())
        lo, hi = (1 << (k - 1)) + 1, 1 << k
        name = str(hi) if lo == hi else f"{lo}-{hi}"
        bins[name] = bins.get(name, 0) + 1
    return dict(sorted(bins.items(), key=lambda kv: int(kv[0].split("-")[0])))
