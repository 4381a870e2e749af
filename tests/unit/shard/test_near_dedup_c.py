"""The C word-shingle path (transforms/shard/_shingles.c) against the numpy path it accelerates: the same window
hashes, shingle sets, one-permutation signatures and band keys, bit for bit, on fuzzed text (ASCII, non-ASCII,
CJK, empty, one word, huge words, punctuation only). The numpy path stays the fallback where the extension was
not built, so the shard job's bytes must not depend on which one ran."""
from __future__ import annotations

import random

import numpy as np
import pytest

from transforms.shard.near_dedup import hashing, minhash, shingling

pytestmark = pytest.mark.skipif(hashing.fast is None, reason="transforms.shard._shingles was not built (no compiler): "
                                "only the numpy path exists here")


def _fuzzed_texts(seed: int, count: int) -> list:
    rng = random.Random(seed)
    alphabet = "aZ_9 .\n\t-qQ,!'\"()"
    fixed = ["", " ", "  \t\n ", "...", "?!", "x", "one", "two words", "a b c d", "a b c d e", "a b c d e f",
             "A_b c9 D__ e\tf\ng", "z" * 1023 + " x", "z" * 1024 + " y", "z" * 1025 + " y", "Q" * 70000 + " tail",
             "word " * 3000, "The the THE tHe the the", "_ __ ___", "0 1 2 3 4 5 6 7 8 9",
             "Grüße aus Köln, ÄÖÜ straße eins zwei drei", "東京都 の 天気 は 晴れ です 今日 も 明日 も",
             "日本語のテキストには空白がない", "ascii text then émoji 🙂 and more words after it here",
             "\x00\x01 control \x7f chars in ascii text here now", "İstanbul ǅ ﬁ ß ΣΑΣ words"]
    out = list(fixed)
    for _ in range(count):
        kind = rng.random()
        if kind < 0.6:
            out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400))))
        elif kind < 0.8:
            out.append(" ".join("".join(rng.choice("abcXYZ") for _ in range(rng.randint(1, 8)))
                                for _ in range(rng.randint(0, 80))))
        else:
            out.append("".join(rng.choice(alphabet + "éÄ東京🙂ß") for _ in range(rng.randint(0, 200))))
    return out


@pytest.fixture
def numpy_only(monkeypatch):
    """Run a call with the extension hidden: the numpy path, as on an install without a compiler."""
    def call(fn, *args):
        with monkeypatch.context() as m:
            m.setattr(hashing, "fast", None)
            return fn(*args)
    return call


def test_c_shingles_signatures_and_band_keys_equal_the_numpy_path_bit_for_bit(numpy_only):
    texts = _fuzzed_texts(11, 600)
    rng = random.Random(12)
    for n in (5, 1, 2, 13):
        want = numpy_only(shingling.shingles_batch, texts, n)
        got = shingling.shingles_batch(texts, n)
        for text, g, w in zip(texts, got, want):
            assert g.dtype == w.dtype and np.array_equal(g, w), (n, text[:80])
    for text in texts[:80]:
        assert np.array_equal(shingling.shingles(text), numpy_only(shingling.shingles, text)), text[:80]
    for params in (minhash.MinHashParams(), minhash.MinHashParams(seed=7), minhash.MinHashParams(bands=4, rows=3, seed=3),
                   minhash.MinHashParams(bands=20, rows=5, seed=2**63 + 5)):
        for _ in range(6):
            batch = rng.sample(texts, rng.randint(0, 60))
            want = numpy_only(minhash.signatures, numpy_only(shingling.shingles_batch, batch, params.shingle_words), params)
            assert np.array_equal(minhash.word_signatures(batch, params), want)
            assert np.array_equal(minhash.signatures(shingling.shingles_batch(batch, params.shingle_words), params), want)
            assert np.array_equal(minhash.band_keys(want, params), numpy_only(minhash.band_keys, want, params))
    # densification's rare fallback (no donor bin filled in 32 tries): one shingle in 100 bins hits it
    one = [np.array([h], dtype=np.uint64) for h in range(0, 2**64 - 1, 2**57 + 12345)]
    assert np.array_equal(minhash.signatures(one, minhash.MinHashParams()), numpy_only(minhash.signatures, one, minhash.MinHashParams()))


def test_c_window_counts_send_non_ascii_texts_to_the_python_path():
    flat, counts = shingling.c_windows(["a b c d e f", "", "Köln a b c d e", "ab"], 5)
    assert counts.tolist() == [2, 0, -1, 1] and flat.size == 3
    with pytest.raises(TypeError):
        hashing.fast.windows([b"bytes"], 5)
    with pytest.raises(ValueError):
        hashing.fast.windows(["a"], 0)
