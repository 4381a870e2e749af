"""Nearest-neighbour search with the query's own documents excluded *inside* the search.

Why inside: on real data most exact top-1 neighbours come from the query's own document, and over-fetching then
filtering needs hundreds of candidates at the tail. Database rows are numbered densely with every document's
chunks contiguous (transforms/retrieval/retrieval_chunks.py), so excluding a set of documents is excluding a few id
ranges: `IDSelectorNot(IDSelectorOr(IDSelectorRange, ...))` for Faiss, a column mask for BM25. Chunks whose
tokens equal the query's are excluded the same way (their ids, looked up by token hash). A Faiss selector
applies to a whole `search()` call, so queries are grouped by their exclusion set first. (GPU Faiss ignores
selectors: search stays on CPU.)

Index specs are Faiss `index_factory` strings with inner product on unit vectors: "Flat" (exact) for small
databases, "IVF<n>,Flat" / "IVF<n>,SQ8" / "IVF<n>,PQ<m>np" for large ones ("PQ<m>" alone would ask for
polysemous training, ~30x slower to train and no better here). "OPQ<m>,IVF<n>,PQ<m>np" with `rerank` > 0 keeps
only m bytes of codes + 8 of id per vector in memory and re-ranks its top `rerank` candidates exactly against the
database's vectors on disk (transforms/retrieval/retrieval_rerank.py); so does "IVF<n>,PQ<m>np" with `rerank` > 0,
which `auto` picks from COMPRESSED_MIN_CHUNKS. IVF indexes are trained on a seeded sample and
filled database shard by database shard; each shard's part is written on its own and merged at load.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import numpy as np

EXACT = "Flat"
AUTO = "auto"
EXACT_MAX_CHUNKS = 50_000  # below this "auto" is exact search: small enough to scan every query
# at or above this "auto" is IVF+PQ48 re-ranked from disk (56 B/vector resident instead of SQ8's 392): the
# size where SQ8's resident codes pass ~0.4 GB per worker (1 M x 392 B). Below it SQ8 stays: at 103,814 chunks
# both reach recall@2 ~0.97 but SQ8 answers ~3x the queries/s (docs/RETRIEVAL.md, bench/retrieval_bench.py)
COMPRESSED_MIN_CHUNKS = 1_000_000
COMPRESSED_PQ = 48
COMPRESSED_RERANK = 64


@dataclass(frozen=True)
class IndexConfig:
    spec: str = AUTO  # index_factory string, or "auto"
    nprobe: int = 64
    train_size: int = 100_000  # vectors in the seeded training sample (IVF)
    seed: int = 0
    rerank: int = 0  # candidates re-ranked exactly from the fp16 vectors on disk (0 = none)

    def resolve(self, num_vectors: int) -> "IndexConfig":
        """Turn "auto" into a concrete spec for this database size (an OPQ spec always re-ranks: its codes alone
        reach recall@2 ~0.66, bench/retrieval_bench.py)."""
        if self.spec.startswith("OPQ") and not self.rerank:
            return IndexConfig(self.spec, self.nprobe, self.train_size, self.seed, COMPRESSED_RERANK)
        if self.spec != AUTO:
            return self
        if num_vectors < EXACT_MAX_CHUNKS:
            return IndexConfig(EXACT, self.nprobe, self.train_size, self.seed)
        nlist = 1 << max(4, int(round(np.log2(4 * np.sqrt(num_vectors)))))
        if num_vectors >= COMPRESSED_MIN_CHUNKS:
            # no OPQ rotation: with re-ranking it buys no recall here and costs ~13x the training time
            # (bench/retrieval_bench.py, docs/RETRIEVAL.md "Measured")
            return IndexConfig(f"IVF{nlist},PQ{COMPRESSED_PQ}np", self.nprobe, self.train_size,
                               self.seed, self.rerank or COMPRESSED_RERANK)
        return IndexConfig(f"IVF{nlist},SQ8", self.nprobe, self.train_size, self.seed)

    def to_dict(self) -> dict:
        d = {"spec": self.spec, "nprobe": self.nprobe, "train_size": self.train_size, "seed": self.seed}
        if self.rerank:  # absent when 0, so existing databases keep their fingerprints
            d["rerank"] = self.rerank
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "IndexConfig":
        rerank = int(d.get("rerank", 0))
        if rerank < 0:
            raise ValueError(f"index config: rerank {rerank} is negative")
        return cls(d["spec"], int(d["nprobe"]), int(d["train_size"]), int(d["seed"]), rerank)


def validate_spec(spec: str) -> Optional[str]:
    """A problem with an index spec, or None."""
    if spec in (AUTO, EXACT):
        return None
    if re.fullmatch(r"IVF\d+,(Flat|SQ8|SQ4|SQfp16|PQ\d+(x\d+)?np)", spec):
        return None
    opq = re.fullmatch(r"OPQ(\d+),IVF\d+,PQ(\d+)np", spec)
    if opq:
        return None if opq.group(1) == opq.group(2) else f"index spec {spec!r}: OPQ<m> and PQ<m> need the same m"
    if re.fullmatch(r"(OPQ\d+,)?IVF\d+,PQ\d+(x\d+)?", spec):
        return f"index spec {spec!r}: write PQ<m>np (plain PQ<m> asks Faiss for polysemous training, ~30x slower)"
    return f"index spec {spec!r}: use auto, Flat, IVF<n>,Flat, IVF<n>,SQ8, IVF<n>,PQ<m>np or OPQ<m>,IVF<n>,PQ<m>np"


def new_index(dim: int, spec: str):
    import faiss  # noqa: PLC0415

    return faiss.index_factory(dim, spec, faiss.METRIC_INNER_PRODUCT)


def training_sample(num_vectors: int, train_size: int, seed: int) -> np.ndarray:
    """Sorted ids of the seeded training sample (same ids for the same database and seed)."""
    if num_vectors <= train_size:
        return np.arange(num_vectors, dtype=np.int64)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(num_vectors, size=train_size, replace=False)).astype(np.int64)


def train_index(dim: int, config: IndexConfig, sample: np.ndarray):
    """An empty index of `config.spec`, trained on `sample` (no-op training for Flat)."""
    import faiss  # noqa: PLC0415

    faiss.omp_set_num_threads(1)
    index = new_index(dim, config.spec)
    if not index.is_trained:
        index.train(np.ascontiguousarray(sample, dtype=np.float32))
    return index


def fill_part(trained_bytes: bytes, vectors: np.ndarray, first_id: int):
    """One database shard's part: a copy of the trained index holding that shard's vectors with their ids."""
    import faiss  # noqa: PLC0415

    part = faiss.deserialize_index(np.frombuffer(trained_bytes, dtype=np.uint8))
    vecs = np.ascontiguousarray(vectors, dtype=np.float32)
    if isinstance(part, faiss.IndexFlat) or part.__class__.__name__.startswith("IndexFlat"):
        part.add(vecs)
    else:
        part.add_with_ids(vecs, np.arange(first_id, first_id + len(vecs), dtype=np.int64))
    return part


def serialize(index) -> bytes:
    import faiss  # noqa: PLC0415

    return faiss.serialize_index(index).tobytes()


def deserialize(data: bytes):
    import faiss  # noqa: PLC0415

    return faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))


def merge_parts(trained_bytes: bytes, parts: Iterable[bytes]):
    """The whole index from the trained empty one and the shard parts, in database order (Flat ids = rows)."""
    index = deserialize(trained_bytes)
    for data in parts:
        part = deserialize(data)
        index.merge_from(part, 0)
    return index


# --------------------------------------------------------------------------------------------- exclusion
@dataclass(frozen=True)
class Exclusion:
    """Ids a query must not get: id ranges [lo, hi) of its documents, and single ids of equal-token chunks."""
    ranges: tuple[tuple[int, int], ...] = ()  # [lo, hi) dense ids
    ids: tuple[int, ...] = ()

    @property
    def key(self) -> tuple:
        return (self.ranges, self.ids)

    def contains(self, ids: np.ndarray) -> np.ndarray:
        """Boolean per id: True where excluded."""
        ids = np.asarray(ids, np.int64)
        out = np.zeros(ids.shape, dtype=bool)
        for lo, hi in self.ranges:
            out |= (ids >= lo) & (ids < hi)
        if self.ids:
            out |= np.isin(ids, np.asarray(self.ids, np.int64))
        return out

    def mask(self, n: int) -> np.ndarray:
        """Boolean [n], True where excluded."""
        m = np.zeros(n, dtype=bool)
        for lo, hi in self.ranges:
            m[lo:hi] = True
        if self.ids:
            m[np.asarray(self.ids, dtype=np.int64)] = True
        return m


def faiss_search_params(exclusion: Exclusion, nprobe: int, is_ivf: bool):
    """SearchParameters whose selector rejects the excluded ids; returns (params, keep-alive list)."""
    import faiss  # noqa: PLC0415

    keep = []
    selectors = []
    for lo, hi in exclusion.ranges:
        s = faiss.IDSelectorRange(int(lo), int(hi))
        keep.append(s)
        selectors.append(s)
    if exclusion.ids:
        arr = np.asarray(exclusion.ids, dtype=np.int64)
        s = faiss.IDSelectorBatch(len(arr), faiss.swig_ptr(arr))
        keep += [arr, s]
        selectors.append(s)
    params = faiss.SearchParametersIVF() if is_ivf else faiss.SearchParameters()
    if is_ivf:
        params.nprobe = nprobe
    if selectors:
        combined = selectors[0]
        for s in selectors[1:]:
            combined = faiss.IDSelectorOr(combined, s)
            keep.append(combined)
        sel = faiss.IDSelectorNot(combined)
        keep.append(sel)
        params.sel = sel
    keep.append(params)
    return params, keep


def group_by_exclusion(exclusions: Sequence[Exclusion]) -> list:
    """[(exclusion, [query positions])] in first-seen order: one search() call per distinct exclusion."""
    groups: dict = {}
    for i, e in enumerate(exclusions):
        groups.setdefault(e.key, (e, []))[1].append(i)
    return list(groups.values())


def dense_search(index, queries: np.ndarray, exclusions: Sequence[Exclusion], k: int,
                 nprobe: int = 64) -> tuple:
    """(scores [n, k] float32, ids [n, k] int64, -1 where fewer than k candidates) with exclusion applied."""
    import faiss  # noqa: PLC0415

    n = len(queries)
    scores = np.full((n, k), -np.inf, dtype=np.float32)
    ids = np.full((n, k), -1, dtype=np.int64)
    is_ivf = faiss.try_extract_index_ivf(index) is not None
    if is_ivf:
        faiss.extract_index_ivf(index).nprobe = nprobe
    q = np.ascontiguousarray(queries, dtype=np.float32)
    for exclusion, positions in group_by_exclusion(exclusions):
        params, _keep = faiss_search_params(exclusion, nprobe, is_ivf)
        pos = np.asarray(positions)
        d, i = index.search(q[pos], k, params=params)
        scores[pos], ids[pos] = d, i
    return scores, ids


def exact_search(vectors: np.ndarray, queries: np.ndarray, exclusions: Sequence[Exclusion], k: int) -> tuple:
    """Brute force with numpy, for tests and recall measurements (ties broken by lower id)."""
    sims = np.asarray(queries, np.float32) @ np.asarray(vectors, np.float32).T
    return topk_masked(sims, exclusions, k)


def topk_masked(scores: np.ndarray, exclusions: Sequence[Exclusion], k: int, min_score: float = -np.inf) -> tuple:
    """Top k per row of a [n, N] score matrix with exclusions, deterministic: score desc, then id asc.

    Candidates at or below `min_score` are not neighbours (BM25: no shared token); missing slots are -1.
    """
    n, total = scores.shape
    out_s = np.full((n, k), -np.inf, dtype=np.float32)
    out_i = np.full((n, k), -1, dtype=np.int64)
    for r in range(n):
        row = scores[r].astype(np.float32, copy=True)
        row[exclusions[r].mask(total)] = -np.inf
        take = min(k, total)
        cand = np.argpartition(-row, take - 1)[:take] if take < total else np.arange(total)
        # widen to every id tied with the k-th score so the tie-break by id is exact
        kth = np.min(row[cand]) if take else -np.inf
        if kth > min_score:
            cand = np.flatnonzero(row >= kth)
        else:
            cand = np.flatnonzero(row > min_score)
        order = np.lexsort((cand, -row[cand]))[:take]
        chosen = cand[order]
        good = row[chosen] > min_score
        chosen = chosen[good]
        out_i[r, :len(chosen)] = chosen
        out_s[r, :len(chosen)] = row[chosen]
    return out_s, out_i
