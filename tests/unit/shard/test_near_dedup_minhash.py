"""Near-dedup's signatures and LSH (transforms/shard/near_dedup/minhash.py): seeded sketches that estimate
Jaccard, band keys, the S-curve."""
from __future__ import annotations

import random

import numpy as np
import pytest

from transforms.shard.near_dedup import minhash, shingling

TEXT = " ".join(f"word{i % 97} token{i % 13} item{i}" for i in range(120))


def test_signatures_are_seeded_batched_and_estimate_jaccard():
    words = TEXT.split()
    edited = " ".join(words[: int(len(words) * 0.8)])  # a truncation: Jaccard known from the shingles
    a, b = shingling.shingles(TEXT), shingling.shingles(edited)
    truth = minhash.exact_jaccard(a, b)
    params = minhash.MinHashParams(bands=16, rows=16, seed=3)
    batch = minhash.signatures([a, b, np.zeros(0, np.uint64)], params)
    assert batch.shape == (3, 256) and batch.dtype == np.uint32
    assert np.array_equal(batch[0], minhash.signatures([a], params)[0])  # batch-independent
    assert not np.array_equal(batch[0], minhash.signatures([a], minhash.MinHashParams(16, 16, seed=4))[0])
    assert abs(minhash.estimated_jaccard(batch[0], batch[1]) - truth) < 0.1
    assert (batch[2] == 0xFFFFFFFF).all()


def test_band_keys_meet_for_copies_and_differ_by_band():
    params = minhash.MinHashParams()
    sigs = minhash.signatures([shingling.shingles(TEXT), shingling.shingles(TEXT.upper()), shingling.shingles("other text " * 40)], params)
    keys = minhash.band_keys(sigs, params)
    assert keys.shape == (3, params.bands)
    assert np.array_equal(keys[0], keys[1])
    assert not set(keys[0].tolist()) & set(keys[2].tolist())
    same = np.zeros((1, params.num_perm), np.uint32)
    assert len(set(minhash.band_keys(same, params)[0].tolist())) == params.bands  # band index mixed in


def test_s_curve_of_the_defaults_is_steep_near_0_8():
    b, r = minhash.DEFAULT_BANDS, minhash.DEFAULT_ROWS
    assert 0.75 < minhash.lsh_threshold(b, r) < 0.85
    assert minhash.s_curve(0.9, b, r) > 0.95 and minhash.s_curve(0.5, b, r) < 0.15
    assert "threshold ~0.79" in minhash.s_curve_text(b, r)


def test_exact_jaccard():
    a = np.array([1, 2, 3, 4], np.uint64)
    assert minhash.exact_jaccard(a, np.array([3, 4, 5, 6], np.uint64)) == pytest.approx(2 / 6)
    assert minhash.exact_jaccard(a, a) == 1.0


def test_one_permutation_hashing_estimates_jaccard_like_minhash_and_densifies_short_texts():
    rng = random.Random(5)
    words = TEXT.split()
    errors = {sketch: [] for sketch in minhash.SKETCHES}
    for trial in range(40):  # a seed per trial: independent estimates
        cut = " ".join(words[: int(len(words) * rng.uniform(0.5, 1.0))])
        a, b = shingling.shingles(TEXT), shingling.shingles(cut)
        for sketch in minhash.SKETCHES:
            s = minhash.signatures([a, b], minhash.MinHashParams(seed=trial, sketch=sketch))
            errors[sketch].append(minhash.estimated_jaccard(s[0], s[1]) - minhash.exact_jaccard(a, b))
    for sketch, err in errors.items():
        assert abs(np.mean(err)) < 0.03 and np.sqrt(np.mean(np.square(err))) < 0.08, sketch
    params = minhash.MinHashParams()
    assert params.sketch == "oph"
    short = shingling.shingles("only a few words in this one text here")  # 5 shingles for 100 bins
    sig = minhash.signatures([short, short, shingling.shingles("something else entirely, not like it at all")], params)
    assert np.array_equal(sig[0], sig[1]) and len(set(sig[0].tolist())) == short.size  # every bin filled
    assert minhash.estimated_jaccard(sig[0], sig[2]) < 0.2
    assert not np.array_equal(sig[0], minhash.signatures([short], minhash.MinHashParams(seed=1))[0])
    with pytest.raises(ValueError, match="unknown sketch"):
        minhash.signatures([short], minhash.MinHashParams(sketch="nope"))
