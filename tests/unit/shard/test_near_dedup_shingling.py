"""Near-dedup's shingles (transforms/shard/near_dedup/shingling.py): word n-grams of normalised text, token n-grams
of ids, the batch and ASCII paths equal to the per-text regex path."""
from __future__ import annotations

import random

import numpy as np

from transforms.shard.near_dedup import minhash, shingling

TEXT = " ".join(f"word{i % 97} token{i % 13} item{i}" for i in range(120))


def test_shingles_ignore_case_spacing_and_punctuation_but_not_word_order():
    base = shingling.shingles("The quick brown fox jumps over the lazy dog")
    assert np.array_equal(base, shingling.shingles("the  QUICK brown, fox jumps\nover the lazy dog!"))
    assert not np.array_equal(base, shingling.shingles("The quick brown fox jumps over the dog lazy"))
    assert not np.array_equal(shingling.shingles("a b c d e"), shingling.shingles("e d c b a"))  # one window, reordered
    assert shingling.shingles("two words").size == 1  # shorter than 5 words: one shingle of all of them
    assert shingling.shingles("   ...  ").size == 0


def test_shingles_of_a_text_equal_the_ngram_hashes_of_its_word_list_and_tell_words_apart():
    text = "  Ünïcode wörds, snake_case 42 — and émoji 🙂 text: ab ba a aa b " + TEXT[:300] + "!!"
    assert np.array_equal(shingling.shingles(text), np.unique(shingling.ngram_hashes(shingling.normalised_words(text), 5)))
    w = shingling._word_hashes(["ab", "ba", "a", "aa", "b", "ab", "é", "e"])
    assert w[0] == w[5] and len(set(w.tolist())) == 7
    vocab = [f"w{i}x{i % 7}" for i in range(20000)]
    assert len(set(shingling._word_hashes(vocab).tolist())) == len(vocab)


def test_ascii_shingles_from_bytes_equal_the_regex_path():
    """shingles() reads ASCII text straight from its bytes; the values must be those of the lower()/`\\W+` path
    (non-ASCII text still takes it), words longer than the power table included."""
    def regex_path(text):
        h = np.sort(shingling._window_hashes(shingling._joined_word_hashes(shingling._NON_WORD.sub(" ", text.lower()).strip(" ")), 5))
        return h[np.concatenate(([True], h[1:] != h[:-1]))] if h.size else h

    rng = random.Random(3)
    texts = ["", "  \t ", "?!", "x", "A_b c9 D__ e\tf\ng", "z" * 1500 + " Tail", TEXT, "Grüße aus Köln, ÄÖÜ straße"]
    texts += ["".join(rng.choice("aZ_9 .\n-qQ") for _ in range(rng.randint(0, 120))) for _ in range(500)]
    for text in texts:
        got, want = shingling.shingles(text), regex_path(text)
        assert got.dtype == want.dtype and np.array_equal(got, want), text


def test_shingles_of_a_batch_equal_each_text_alone():
    """The shard job shingles a batch of documents together (shingling.shingles_batch): every text gets the
    array `shingles` gives it alone, short, empty, word-less and non-ASCII texts included, in any mix."""
    rng = random.Random(5)
    pool = ["", " ", "...", "one", "two words", "a b c d", "a b c d e", TEXT, "Grüße aus Köln, ÄÖÜ straße eins zwei",
            "z" * 1100 + " Tail end of it"]
    pool += ["".join(rng.choice("aZ_9 .\n-qQé") for _ in range(rng.randint(0, 60))) for _ in range(200)]
    for _ in range(100):
        batch = rng.sample(pool, rng.randint(0, 30))
        for n in (5, 2):
            for text, got in zip(batch, shingling.shingles_batch(batch, n)):
                assert np.array_equal(got, shingling.shingles(text, n)), text


def token_shingles(ids, n: int = shingling.SHINGLE_TOKENS) -> np.ndarray:
    """One document's shingles: a batch of one (the stage signs whole batches: pipeline/shard/near_dedup/sign.py)."""
    return shingling.token_shingles_batch([ids], n)[0]


def _naive_token_shingles(ids, n):
    """The reference: each window's ids hashed one by one in Python (start at n, then per id h = h * golden +
    mix(id ^ salt), 64-bit wrapping, mix at the end), sorted unique; fewer than n ids: one window of all."""
    m = (1 << 64) - 1

    def mix(x):
        x ^= x >> 30
        x = (x * 0xBF58476D1CE4E5B9) & m
        x ^= x >> 27
        x = (x * 0x94D049BB133111EB) & m
        return x ^ (x >> 31)

    ids = [int(i) for i in ids]
    if not ids:
        return np.zeros(0, dtype=np.uint64)
    k = min(n, len(ids))
    out = set()
    for lo in range(len(ids) - k + 1):
        h = k
        for t in ids[lo:lo + k]:
            h = (h * 0x9E3779B97F4A7C15 + mix(t ^ 0x746F6B656E736869)) & m
        out.add(mix(h))
    return np.array(sorted(out), dtype=np.uint64)


def test_token_shingles_of_a_batch_equal_a_naive_reference_per_document():
    """--near-dedup-shingles tokens (shingling.token_shingles_batch): every document of a batch gets the
    windows that lie inside it, short and empty ones included, whatever the id dtype the spill holds;
    unique=False holds the same values (repeated, in text order) and gives the same signatures."""
    rng = np.random.default_rng(3)
    docs = [np.zeros(0, np.int32), np.array([7], np.int32), np.array([1, 2, 3, 4], np.uint16),
            np.array([5, 5, 5, 5, 5, 5, 5], np.uint16)]
    docs += [rng.integers(0, 300, rng.integers(0, 40)).astype(rng.choice([np.int32, np.uint16, np.uint32]))
             for _ in range(60)]
    for n in (5, 3, 1):
        got = shingling.token_shingles_batch(docs, n)
        loose = shingling.token_shingles_batch(docs, n, unique=False)
        for ids, g, l in zip(docs, got, loose):
            ref = _naive_token_shingles(ids, n)
            assert np.array_equal(g, ref), (n, ids)
            assert np.array_equal(np.unique(l), ref)
        params = minhash.MinHashParams()
        assert np.array_equal(minhash.signatures(got, params), minhash.signatures(loose, params))
    assert np.array_equal(token_shingles(docs[5]), shingling.token_shingles_batch(docs, 5)[5])
    # order matters: a swap changes windows
    assert not np.array_equal(token_shingles([1, 2, 3, 4, 5]), token_shingles([2, 1, 3, 4, 5]))
    assert shingling.token_shingles_batch([], 5) == []
