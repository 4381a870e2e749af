"""The near-dedup graph's pure parts: its nodes, the star edges of a band bucket, label propagation (the
reference the Beam graph unrolls into rounds), and the keeper rule.

Keeper: the rule of exact dedup (transforms/shard/documents.py `split_wins`): test over val over train, then the
smallest document id. `rank` encodes it so that the smallest rank wins. Incrementally a committed document
outranks every new one (`rank(..., committed=True)`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple, Optional

import numpy as np

from transforms.shard.near_dedup.minhash import SIGNATURE_DTYPE, estimated_jaccard

DEFAULT_ROUNDS = 12
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
    from a committed generation's band index (band_index.py): its `loc` is
    ("committed", generation), it has no staged shingles or text, and it is never removed."""
    rank: tuple[int, int]
    doc_id: int
    split: int
    sig: bytes
    source: str = ""
    loc: tuple[str | int, ...] = ()
    excerpt: str = ""
    committed: bool = False

    def signature(self) -> np.ndarray:
        return np.frombuffer(self.sig, dtype=SIGNATURE_DTYPE)


class Edge(NamedTuple):
    """Two documents near each other: `a` the better ranked, with their (estimated or exact) Jaccard."""
    a: Node
    b: Node
    jaccard: float


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
                out.append(Edge(c, m, j))
                break
    centre = new[0]
    csig = centre.signature()
    for m in new[1:]:
        j = estimated_jaccard(csig, m.signature())
        if j >= threshold:
            out.append(Edge(centre, m, j))
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
