"""An IVF index cut into R ranges of inverted lists, searched range by range and merged to the same answer.

Range r holds lists [r*nlist/R, (r+1)*nlist/R) (`list_range`). A query goes to the ranges its nprobe lists fall
in (`probe_ranges`, from the coarse quantizer alone, which every worker holds: nlist x dim floats); each range
searches only its own lists with the same nprobe and the same exclusion selector (retrieval_index.dense_search),
so its candidates are exactly the full search's candidates that live in that range. Scores of one (query, row)
do not depend on which other lists are present (IVF scans each list on its own), so the union of the ranges'
top K contains the full search's top K.

Order is fixed by a stated rule, never by Faiss's heap or the runner's arrival order: candidates are ranked by
(approximate score desc, row asc) and cut at K (`cut`), then re-ranked by (exact score from the stored vectors
desc, row asc) (`merge`). Each range returns every row that scores at least its own K-th score, ties included
(`range_candidates` fetches K + TIE_SLACK and fetches again, doubling, while the tie runs past the end), so the
rows tied with the overall K-th score are all there and decided by row number, never by Faiss's order: the
overall K-th score is at least every range's K-th (a range with K rows above it would put them in the top K).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from transforms.retrieval import retrieval_index

TIE_SLACK = 8


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
    """Per query, [(score, row)] of this range's best candidates under the exclusion, ranked by `cut`'s rule: every
    row scoring at least the range's K-th score, ties at it included. Faiss returns tied rows in its own order, so a
    query whose last fetched score still equals its K-th is fetched again with twice the count, until the last is
    lower or the range has no more rows (copies of one chunk, e.g. a licence header, tie at any count)."""
    fetch = num_candidates + TIE_SLACK
    out: list = [None] * len(queries)
    todo = list(range(len(queries)))
    while todo:
        scores, ids = retrieval_index.dense_search(index, queries[todo], [exclusions[i] for i in todo], fetch, nprobe)
        again = []
        for i, s, r in zip(todo, scores, ids):
            live = r >= 0
            found = [(float(a), int(b)) for a, b in zip(s[live], r[live])]
            out[i] = found
            if len(found) == fetch and num_candidates <= fetch and found[-1][0] == found[num_candidates - 1][0]:
                again.append(i)  # the tie at the K-th score may go on past what was fetched
        todo, fetch = again, fetch * 2
    return out


def cut(candidates: Sequence, num_candidates: int) -> list:
    """Rows of the best `num_candidates` by (score desc, row asc) over every range's lists (a row seen twice once)."""
    best = {}
    for score, row in candidates:
        best[row] = score
    ranked = sorted(best.items(), key=lambda t: (-t[1], t[0]))
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
