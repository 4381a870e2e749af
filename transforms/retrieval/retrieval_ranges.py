"""An IVF index cut into R ranges of inverted lists, searched range by range and merged to the same answer.

Range r holds lists [r*nlist/R, (r+1)*nlist/R) (`list_range`). A query goes to the ranges its nprobe lists fall
in (`probe_ranges`, from the coarse quantizer alone, which every worker holds: nlist x dim floats); each range
searches only its own lists with the same nprobe and the same exclusion selector (retrieval_index.dense_search),
so its candidates are exactly the full search's candidates that live in that range. Scores of one (query, row)
do not depend on which other lists are present (IVF scans each list on its own), so the union of the ranges'
top K contains the full search's top K.

Order is fixed by a stated rule, never by Faiss's heap or the runner's arrival order: candidates are ranked by
(approximate score desc, row asc) and cut at K (`cut`), then re-ranked by (exact score from the stored vectors
desc, row asc) (`merge`). Each range asks Faiss for K + TIE_SLACK candidates, so rows tied with the K-th score
are decided by row number too; `cut` reports when more than TIE_SLACK rows tie across the cut (then the answer
could depend on Faiss's internal order, and the caller fails rather than write such a sidecar).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from transforms.retrieval import retrieval_index

TIE_SLACK = 8


class TieOverflowError(RuntimeError):
    """More rows tie at the candidate cut than a range fetched: the order would not be decided by row."""


def list_range(list_no: np.ndarray, nlist: int, num_ranges: int) -> np.ndarray:
    return (np.asarray(list_no, np.int64) * num_ranges) // nlist


def ivf_of(index):
    import faiss  # noqa: PLC0415

    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        raise ValueError("sharded search needs an IVF index (Flat has no inverted lists to cut)")
    return ivf


def probe_ranges(index, queries: np.ndarray, nprobe: int, num_ranges: int) -> list:
    """Per query, the sorted ranges its nprobe closest lists fall in."""
    import faiss  # noqa: PLC0415

    ivf = ivf_of(index)
    q = np.ascontiguousarray(queries, np.float32)
    if isinstance(index, faiss.IndexPreTransform):
        q = index.apply_chain(len(q), q)
    _, lists = ivf.quantizer.search(q, min(nprobe, ivf.nlist))
    ranges = list_range(lists, ivf.nlist, num_ranges)
    return [sorted(set(int(r) for r in row if r >= 0)) for row in ranges]


def range_index(index_bytes: bytes, r: int, num_ranges: int):
    """The index with only range r's lists kept (the others emptied): what one worker loads."""
    index = retrieval_index.deserialize(index_bytes)
    ivf = ivf_of(index)
    invlists = ivf.invlists
    for list_no in range(ivf.nlist):
        if int(list_range(np.asarray([list_no]), ivf.nlist, num_ranges)[0]) != r:
            invlists.resize(list_no, 0)
    ivf.ntotal = sum(invlists.list_size(i) for i in range(ivf.nlist))
    index.ntotal = ivf.ntotal
    return index


def range_candidates(index, queries: np.ndarray, exclusions: Sequence, num_candidates: int, nprobe: int) -> list:
    """Per query, [(score, row)] of this range's best candidates under the exclusion, ranked by `cut`'s rule."""
    scores, ids = retrieval_index.dense_search(index, queries, exclusions, num_candidates + TIE_SLACK, nprobe)
    out = []
    for s, i in zip(scores, ids):
        live = i >= 0
        out.append([(float(a), int(b)) for a, b in zip(s[live], i[live])])
    return out


def cut(candidates: Sequence, num_candidates: int) -> list:
    """Rows of the best `num_candidates` by (score desc, row asc) over every range's lists (a row seen twice once)."""
    best = {}
    for score, row in candidates:
        best[row] = score
    ranked = sorted(best.items(), key=lambda t: (-t[1], t[0]))
    if len(ranked) > num_candidates:
        boundary = ranked[num_candidates - 1][1]
        tied = sum(1 for _, s in ranked if s == boundary)
        if tied > TIE_SLACK:
            raise TieOverflowError(f"{tied} candidates tie at score {boundary} (more than {TIE_SLACK})")
    return [row for row, _ in ranked[:num_candidates]]


def merge(query: np.ndarray, candidates: Sequence, num_candidates: int, k: int,
          rows: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """The k neighbour rows of one query from its ranges' candidates: cut at K, exact re-rank, -1 padded."""
    chosen = np.asarray(sorted(cut(candidates, num_candidates)), np.int64)
    out = np.full(k, -1, np.int64)
    if len(chosen) == 0:
        return out
    exact = np.asarray(rows(chosen), np.float32) @ np.asarray(query, np.float32)
    order = np.lexsort((chosen, -exact))[:k]
    out[:len(order)] = chosen[order]
    return out
