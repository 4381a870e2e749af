"""Near-dedup's graph logic (transforms/shard/near_dedup/clusters.py): the keeper rule, band buckets' star edges,
label propagation and cluster sizes."""
from __future__ import annotations

import random

from transforms.shard.near_dedup import clusters, minhash, shingling

TEXT = " ".join(f"word{i % 97} token{i % 13} item{i}" for i in range(120))


def _node(doc_id, split=0, text=TEXT, params=minhash.MinHashParams()):
    sig = minhash.signatures([shingling.shingles(text)], params)[0]
    return clusters.Node(clusters.rank(split, doc_id), doc_id, split, sig.tobytes())


def test_keeper_rule_is_exact_dedups_test_over_val_over_train_then_smallest_id():
    train_small, val_big, test_big = _node(5, 0), _node(90, 1), _node(99, 2)
    assert clusters.best_label([train_small, val_big, test_big]) == test_big
    assert clusters.best_label([train_small, val_big]) == val_big
    assert clusters.best_label([_node(7), _node(5)]).doc_id == 5


def test_bucket_copies_collapse_to_the_highest_split_whatever_the_order():
    nodes = [_node(5, 0), _node(5, 2), _node(6, 0)]
    for perm in ([0, 1, 2], [2, 1, 0], [1, 2, 0]):
        merged = clusters.merge_copies([nodes[i] for i in perm])
        assert [(n.doc_id, n.split) for n in merged] == [(5, 2), (6, 0)]
    edges = clusters.bucket_edges(nodes, 0.8)
    assert [(a.doc_id, b.doc_id) for a, b, _ in edges] == [(5, 6)]
    far = _node(7, 0, text="completely different " * 50)
    assert clusters.bucket_edges([nodes[0], far], 0.8) == []  # below the threshold: no edge


def test_components_pick_one_keeper_per_cluster_in_any_edge_order_and_report_non_convergence():
    chain = [_node(i) for i in range(10, 16)]  # a path 10-11-...-15: keeper 10, five rounds away
    edges = [(chain[i], chain[i + 1], 0.9) for i in range(5)] + [(_node(50), _node(40), 0.9)]
    for seed in range(3):
        random.Random(seed).shuffle(edges)
        labels, converged = clusters.components(edges, rounds=8)
        assert converged
        assert {d: k.doc_id for d, (_n, k) in labels.items()} == {**{i: 10 for i in range(10, 16)}, 40: 40, 50: 40}
    _labels, converged = clusters.components(edges, rounds=3)
    assert not converged
    node, keeper = labels[12]
    assert clusters.removal_of(node, keeper) == (12, 10, 1.0)
    assert clusters.removal_of(*labels[10]) is None


def test_cluster_size_bins():
    assert clusters.cluster_size_bins([2, 2, 3, 4, 5, 9]) == {"2": 2, "3-4": 2, "5-8": 1, "9-16": 1}
