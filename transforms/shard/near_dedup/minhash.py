"""Signatures and LSH band keys of shingle sets, and the Jaccard estimates they give.

- Signatures: `bands * rows` values per document by one-permutation hashing with optimal densification
  (`oph_signatures`, one seeded hash per shingle), or by classic MinHash with that many permutations
  (`minhash_signatures`, kept for the bench); both seeded by `seed` and computed in batch.
- LSH: a pair with Jaccard J shares at least one band with probability 1 - (1 - J^rows)^bands (`s_curve`). The
  defaults (10 bands x 10 rows) put the threshold (1/bands)^(1/rows) at 0.79: P = 0.01 at J = 0.5, 0.25 at
  0.7, 0.68 at 0.8, 0.99 at 0.9. A candidate becomes an edge only if its estimated (or, with verify, exact)
  Jaccard reaches the threshold, which is what keeps pairs below 0.7 out.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import numpy as np

from transforms.shard.near_dedup import hashing, shingling
from transforms.shard.near_dedup.hashing import GOLDEN, M64, mix

DEFAULT_BANDS = 10
DEFAULT_ROWS = 10
DEFAULT_THRESHOLD = 0.8
SKETCHES = ("oph", "minhash")
DEFAULT_SKETCH = "oph"
OPH_DONOR_ATTEMPTS = 32
SIGNATURE_DTYPE = np.dtype("<u4")


@dataclass(frozen=True)
class MinHashParams:
    bands: int = DEFAULT_BANDS
    rows: int = DEFAULT_ROWS
    seed: int = 0
    shingle_words: int = shingling.SHINGLE_WORDS
    sketch: str = DEFAULT_SKETCH
    shingles: str = shingling.DEFAULT_SHINGLES  # SHINGLE_KINDS: word 5-grams of the text or token n-grams of its ids

    @property
    def num_perm(self) -> int:
        return self.bands * self.rows

    def coefficients(self) -> tuple:
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([0x6E646475, self.seed & M64])))
        a = rng.integers(0, 1 << 63, size=self.num_perm, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
        b = rng.integers(0, 1 << 63, size=self.num_perm, dtype=np.uint64)
        return a, b


def word_signatures(texts: list, params: MinHashParams, coefficients: Optional[tuple] = None) -> np.ndarray:
    """`signatures(shingles_batch(texts), params)`, the same values: with the C extension and the default
    one-permutation sketch straight from the texts' window hashes (a bin's minimum is the same over the windows
    with repeats as over the sorted unique set, so nothing is sorted); non-ASCII texts' windows from the Python
    path. The shard job calls this when it stages no shingles (no --near-dedup-verify)."""
    if hashing.fast is None or params.sketch != "oph":
        return signatures(shingling.shingles_batch(texts, params.shingle_words), params, coefficients)
    texts = list(texts)
    flat, counts = shingling.c_windows(texts, params.shingle_words)
    if (counts < 0).any():  # the non-ASCII texts' shingles spliced in where their windows would be
        parts, at, fixed = [], 0, counts.copy()
        for i, c in enumerate(counts.tolist()):
            if c < 0:
                sh = shingling.python_shingles(texts[i], params.shingle_words)
                parts.append(sh)
                fixed[i] = sh.size
            else:
                parts.append(flat[at:at + c])
                at += c
        flat = np.concatenate(parts) if parts else flat
        counts = fixed
    return _c_oph(flat, counts, params)


def _c_oph(flat: np.ndarray, counts: np.ndarray, params: MinHashParams) -> np.ndarray:
    salt, donors = _oph_tables(params)
    out = hashing.fast.oph(np.ascontiguousarray(flat, dtype="<u8"), np.ascontiguousarray(counts, dtype="<i8"),
                           params.num_perm, int(salt), np.ascontiguousarray(donors, dtype="<i8"))
    return np.frombuffer(out, dtype=SIGNATURE_DTYPE).reshape(len(counts), params.num_perm).copy()


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
    if hashing.fast is not None:
        sizes = np.array([len(s) for s in shingle_sets], dtype=np.int64)
        flat = (np.concatenate([np.asarray(s, dtype=np.uint64) for s in shingle_sets]) if int(sizes.sum())
                else np.zeros(0, dtype=np.uint64))
        return _c_oph(flat, sizes, params)
    return _oph_signatures_numpy(shingle_sets, params)


def _oph_signatures_numpy(shingle_sets: list, params: MinHashParams) -> np.ndarray:
    k = params.num_perm
    out = np.full((len(shingle_sets), k), 0xFFFFFFFF, dtype=SIGNATURE_DTYPE)
    nonempty = [i for i, s in enumerate(shingle_sets) if len(s)]
    if not nonempty:
        return out
    sizes = np.array([len(shingle_sets[i]) for i in nonempty], dtype=np.int64)
    flat = np.concatenate([shingle_sets[i] for i in nonempty]).astype(np.uint64)
    salt, donors = _oph_tables(params)
    h = mix(flat ^ salt)
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
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([0x6F706868, params.seed & M64])))
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
    if hashing.fast is not None and sigs.shape[1] == params.num_perm:
        out = hashing.fast.band_keys(np.ascontiguousarray(sigs, dtype=SIGNATURE_DTYPE), params.bands, params.rows)
        return np.frombuffer(out, dtype="<u8").reshape(sigs.shape[0], params.bands).astype(np.uint64)
    return _band_keys_numpy(sigs, params)


def _band_keys_numpy(sigs: np.ndarray, params: MinHashParams) -> np.ndarray:
    sigs = np.atleast_2d(sigs)
    keys = np.empty((sigs.shape[0], params.bands), dtype=np.uint64)
    for band in range(params.bands):
        h = np.full(sigs.shape[0], np.uint64(band + 1), dtype=np.uint64)
        with np.errstate(over="ignore"):
            for j in range(params.rows):
                h = mix(h * GOLDEN + sigs[:, band * params.rows + j].astype(np.uint64))
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

