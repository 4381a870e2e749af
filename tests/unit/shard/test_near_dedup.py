"""Near-dedup's pure parts (transforms/shard/near_dedup.py): shingles, MinHash, LSH, clusters and keepers."""
from __future__ import annotations

import random

import numpy as np
import pytest

from transforms.shard import near_dedup as nd

TEXT = " ".join(f"word{i % 97} token{i % 13} item{i}" for i in range(120))


def _node(doc_id, split=0, text=TEXT, params=nd.MinHashParams()):
    sig = nd.signatures([nd.shingles(text)], params)[0]
    return nd.Node(nd.rank(split, doc_id), doc_id, split, sig.tobytes())


def test_shingles_ignore_case_spacing_and_punctuation_but_not_word_order():
    base = nd.shingles("The quick brown fox jumps over the lazy dog")
    assert np.array_equal(base, nd.shingles("the  QUICK brown, fox jumps\nover the lazy dog!"))
    assert not np.array_equal(base, nd.shingles("The quick brown fox jumps over the dog lazy"))
    assert not np.array_equal(nd.shingles("a b c d e"), nd.shingles("e d c b a"))  # one window, reordered
    assert nd.shingles("two words").size == 1  # shorter than 5 words: one shingle of all of them
    assert nd.shingles("   ...  ").size == 0


def test_signatures_are_seeded_batched_and_estimate_jaccard():
    words = TEXT.split()
    edited = " ".join(words[: int(len(words) * 0.8)])  # a truncation: Jaccard known from the shingles
    a, b = nd.shingles(TEXT), nd.shingles(edited)
    truth = nd.exact_jaccard(a, b)
    params = nd.MinHashParams(bands=16, rows=16, seed=3)
    batch = nd.signatures([a, b, np.zeros(0, np.uint64)], params)
    assert batch.shape == (3, 256) and batch.dtype == np.uint32
    assert np.array_equal(batch[0], nd.signatures([a], params)[0])  # batch-independent
    assert not np.array_equal(batch[0], nd.signatures([a], nd.MinHashParams(16, 16, seed=4))[0])
    assert abs(nd.estimated_jaccard(batch[0], batch[1]) - truth) < 0.1
    assert (batch[2] == 0xFFFFFFFF).all()


def test_band_keys_meet_for_copies_and_differ_by_band():
    params = nd.MinHashParams()
    sigs = nd.signatures([nd.shingles(TEXT), nd.shingles(TEXT.upper()), nd.shingles("other text " * 40)], params)
    keys = nd.band_keys(sigs, params)
    assert keys.shape == (3, params.bands)
    assert np.array_equal(keys[0], keys[1])
    assert not set(keys[0].tolist()) & set(keys[2].tolist())
    same = np.zeros((1, params.num_perm), np.uint32)
    assert len(set(nd.band_keys(same, params)[0].tolist())) == params.bands  # band index mixed in


def test_s_curve_of_the_defaults_is_steep_near_0_8():
    b, r = nd.DEFAULT_BANDS, nd.DEFAULT_ROWS
    assert 0.75 < nd.lsh_threshold(b, r) < 0.85
    assert nd.s_curve(0.9, b, r) > 0.95 and nd.s_curve(0.5, b, r) < 0.15
    assert "threshold ~0.79" in nd.s_curve_text(b, r)


def test_exact_jaccard():
    a = np.array([1, 2, 3, 4], np.uint64)
    assert nd.exact_jaccard(a, np.array([3, 4, 5, 6], np.uint64)) == pytest.approx(2 / 6)
    assert nd.exact_jaccard(a, a) == 1.0


def test_keeper_rule_is_exact_dedups_test_over_val_over_train_then_smallest_id():
    train_small, val_big, test_big = _node(5, 0), _node(90, 1), _node(99, 2)
    assert nd.best_label([train_small, val_big, test_big]) == test_big
    assert nd.best_label([train_small, val_big]) == val_big
    assert nd.best_label([_node(7), _node(5)]).doc_id == 5


def test_bucket_copies_collapse_to_the_highest_split_whatever_the_order():
    nodes = [_node(5, 0), _node(5, 2), _node(6, 0)]
    for perm in ([0, 1, 2], [2, 1, 0], [1, 2, 0]):
        merged = nd.merge_copies([nodes[i] for i in perm])
        assert [(n.doc_id, n.split) for n in merged] == [(5, 2), (6, 0)]
    edges = nd.bucket_edges(nodes, 0.8)
    assert [(a.doc_id, b.doc_id) for a, b, _ in edges] == [(5, 6)]
    far = _node(7, 0, text="completely different " * 50)
    assert nd.bucket_edges([nodes[0], far], 0.8) == []  # below the threshold: no edge


def test_components_pick_one_keeper_per_cluster_in_any_edge_order_and_report_non_convergence():
    chain = [_node(i) for i in range(10, 16)]  # a path 10-11-...-15: keeper 10, five rounds away
    edges = [(chain[i], chain[i + 1], 0.9) for i in range(5)] + [(_node(50), _node(40), 0.9)]
    for seed in range(3):
        random.Random(seed).shuffle(edges)
        labels, converged = nd.components(edges, rounds=8)
        assert converged
        assert {d: k.doc_id for d, (_n, k) in labels.items()} == {**{i: 10 for i in range(10, 16)}, 40: 40, 50: 40}
    _labels, converged = nd.components(edges, rounds=3)
    assert not converged
    node, keeper = labels[12]
    assert nd.removal_of(node, keeper) == (12, 10, 1.0)
    assert nd.removal_of(*labels[10]) is None


def test_cluster_size_bins():
    assert nd.cluster_size_bins([2, 2, 3, 4, 5, 9]) == {"2": 2, "3-4": 2, "5-8": 1, "9-16": 1}


def test_one_permutation_hashing_estimates_jaccard_like_minhash_and_densifies_short_texts():
    rng = random.Random(5)
    words = TEXT.split()
    errors = {sketch: [] for sketch in nd.SKETCHES}
    for trial in range(40):  # a seed per trial: independent estimates
        cut = " ".join(words[: int(len(words) * rng.uniform(0.5, 1.0))])
        a, b = nd.shingles(TEXT), nd.shingles(cut)
        for sketch in nd.SKETCHES:
            s = nd.signatures([a, b], nd.MinHashParams(seed=trial, sketch=sketch))
            errors[sketch].append(nd.estimated_jaccard(s[0], s[1]) - nd.exact_jaccard(a, b))
    for sketch, err in errors.items():
        assert abs(np.mean(err)) < 0.03 and np.sqrt(np.mean(np.square(err))) < 0.08, sketch
    params = nd.MinHashParams()
    assert params.sketch == "oph"
    short = nd.shingles("only a few words in this one text here")  # 5 shingles for 100 bins
    sig = nd.signatures([short, short, nd.shingles("something else entirely, not like it at all")], params)
    assert np.array_equal(sig[0], sig[1]) and len(set(sig[0].tolist())) == short.size  # every bin filled
    assert nd.estimated_jaccard(sig[0], sig[2]) < 0.2
    assert not np.array_equal(sig[0], nd.signatures([short], nd.MinHashParams(seed=1))[0])
    with pytest.raises(ValueError, match="unknown sketch"):
        nd.signatures([short], nd.MinHashParams(sketch="nope"))


def test_shingles_of_a_text_equal_the_ngram_hashes_of_its_word_list_and_tell_words_apart():
    text = "  Ünïcode wörds, snake_case 42 — and émoji 🙂 text: ab ba a aa b " + TEXT[:300] + "!!"
    assert np.array_equal(nd.shingles(text), np.unique(nd.ngram_hashes(nd.normalised_words(text), 5)))
    w = nd._word_hashes(["ab", "ba", "a", "aa", "b", "ab", "é", "e"])
    assert w[0] == w[5] and len(set(w.tolist())) == 7
    vocab = [f"w{i}x{i % 7}" for i in range(20000)]
    assert len(set(nd._word_hashes(vocab).tolist())) == len(vocab)


def test_ascii_shingles_from_bytes_equal_the_regex_path():
    """shingles() reads ASCII text straight from its bytes; the values must be those of the lower()/`\\W+` path
    (non-ASCII text still takes it), words longer than the power table included."""
    def regex_path(text):
        h = np.sort(nd._window_hashes(nd._joined_word_hashes(nd._NON_WORD.sub(" ", text.lower()).strip(" ")), 5))
        return h[np.concatenate(([True], h[1:] != h[:-1]))] if h.size else h

    rng = random.Random(3)
    texts = ["", "  \t ", "?!", "x", "A_b c9 D__ e\tf\ng", "z" * 1500 + " Tail", TEXT, "Grüße aus Köln, ÄÖÜ straße"]
    texts += ["".join(rng.choice("aZ_9 .\n-qQ") for _ in range(rng.randint(0, 120))) for _ in range(500)]
    for text in texts:
        got, want = nd.shingles(text), regex_path(text)
        assert got.dtype == want.dtype and np.array_equal(got, want), text


def test_shingles_of_a_batch_equal_each_text_alone():
    """The shard job shingles a batch of documents together (near_dedup.shingles_batch): every text gets the
    array `shingles` gives it alone, short, empty, word-less and non-ASCII texts included, in any mix."""
    rng = random.Random(5)
    pool = ["", " ", "...", "one", "two words", "a b c d", "a b c d e", TEXT, "Grüße aus Köln, ÄÖÜ straße eins zwei",
            "z" * 1100 + " Tail end of it"]
    pool += ["".join(rng.choice("aZ_9 .\n-qQé") for _ in range(rng.randint(0, 60))) for _ in range(200)]
    for _ in range(100):
        batch = rng.sample(pool, rng.randint(0, 30))
        for n in (5, 2):
            for text, got in zip(batch, nd.shingles_batch(batch, n)):
                assert np.array_equal(got, nd.shingles(text, n)), text


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
    """--near-dedup-shingles tokens (near_dedup.token_shingles_batch): every document of a batch gets the
    windows that lie inside it, short and empty ones included, whatever the id dtype the spill holds;
    unique=False holds the same values (repeated, in text order) and gives the same signatures."""
    rng = np.random.default_rng(3)
    docs = [np.zeros(0, np.int32), np.array([7], np.int32), np.array([1, 2, 3, 4], np.uint16),
            np.array([5, 5, 5, 5, 5, 5, 5], np.uint16)]
    docs += [rng.integers(0, 300, rng.integers(0, 40)).astype(rng.choice([np.int32, np.uint16, np.uint32]))
             for _ in range(60)]
    for n in (5, 3, 1):
        got = nd.token_shingles_batch(docs, n)
        loose = nd.token_shingles_batch(docs, n, unique=False)
        for ids, g, l in zip(docs, got, loose):
            ref = _naive_token_shingles(ids, n)
            assert np.array_equal(g, ref), (n, ids)
            assert np.array_equal(np.unique(l), ref)
        params = nd.MinHashParams()
        assert np.array_equal(nd.signatures(got, params), nd.signatures(loose, params))
    assert np.array_equal(nd.token_shingles(docs[5]), nd.token_shingles_batch(docs, 5)[5])
    # order matters: a swap changes windows
    assert not np.array_equal(nd.token_shingles([1, 2, 3, 4, 5]), nd.token_shingles([2, 1, 3, 4, 5]))
    assert nd.token_shingles_batch([], 5) == []
