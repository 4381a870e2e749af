"""Candidate edges of the near-dedup graph. Files shuffle: the band buckets of one key range, found in numpy
among every unit's staged band rows, window by window (windows.py); the same edges as the runner's GroupByKey
on band keys gives (clusters.bucket_edges sorts the members, so arrival order does not matter). With
--near-dedup-verify an edge stays only if the exact Jaccard of the two documents' staged shingles reaches the
threshold."""
from __future__ import annotations

import pickle

import numpy as np

from pipeline.shard.near_dedup import band_files
from pipeline.shard.near_dedup.elements import RangeTask
from pipeline.shard.near_dedup.windows import RangeWindows
from transforms.io import io_utils
from transforms.shard.near_dedup import clusters, minhash, paths


def range_edges(task: RangeTask, plan, committed: tuple = ()):
    """Files shuffle: the buckets of one key range, read from every unit's band file (and, incrementally, the
    committed generations' band index files of that range); the same edges as the runner's GroupByKey gives
    (bucket_edges sorts the members, so arrival order does not matter). Only buckets with more than one row
    become Nodes (numpy finds them): on distinct text nearly none. Window by window (RangeWindows): a bucket is
    one key, so it lies in one window, and the edges come in the same (key) order as from the whole range."""
    num_perm = plan.config.near_dedup_config.params.num_perm
    threshold = plan.config.near_dedup_config.threshold
    for parts, committed_rows in RangeWindows(plan, task.range, task.unit_names, committed, num_perm).windows():
        yield from window_edges(plan, parts, committed_rows, threshold)


# A bucket of more band rows than this (a boilerplate text with many distinct near-copies) is not built whole:
# its members are found in numpy and made Nodes HOT_CHUNK at a time, per unit (hot_bucket_edges): the same
# edges, in another order.
HOT_BUCKET_ROWS = 1 << 16
HOT_CHUNK = 1 << 13


def window_edges(plan, parts: list, committed_rows: list, threshold: float):
    all_keys = np.concatenate([a["key"] for _n, a in parts]
                              + [np.array([k for k, _n in committed_rows], dtype=np.uint64)])
    keys, counts = np.unique(all_keys, return_counts=True)
    shared = keys[(counts > 1) & (counts <= HOT_BUCKET_ROWS)]
    hot = keys[counts > HOT_BUCKET_ROWS].tolist()
    if not shared.size and not hot:
        return
    hits = [a[np.isin(a["key"], shared)] for _name, a in parts]
    units = np.concatenate([np.full(h.size, u, dtype=np.int32) for u, h in enumerate(hits)])
    hit = np.concatenate(hits)
    nodes = member_nodes(plan, parts, hit["doc_id"], hit["split"].astype(np.int16), units, hit["doc"],
                          np.arange(hit.size))
    buckets: dict = {}
    for key, node in zip(hit["key"].tolist(), nodes):
        buckets.setdefault(key, []).append(node)
    shared_set, hot_set = set(shared.tolist()), set(hot)
    hot_committed: dict = {}
    for k, node in committed_rows:
        if k in shared_set:
            buckets.setdefault(k, []).append(node)
        elif k in hot_set:
            hot_committed.setdefault(k, []).append(node)
    for key in sorted(set(buckets) | hot_set):
        if key in hot_set:
            yield from hot_bucket_edges(plan, key, parts, hot_committed.get(key, []), threshold)
        elif len(buckets[key]) > 1:
            yield from clusters.bucket_edges(buckets[key], threshold)


def hot_bucket_edges(plan, key: int, parts: list, committed_nodes: list, threshold: float):
    """clusters.bucket_edges of one large bucket, without a Node per member at once: the same edges, in
    another order (nothing downstream depends on it: the adjacency is grouped and sorted). The members are
    chosen and ranked in numpy as merge_copies does (per id the copy in the highest split, then the smallest
    location: the first unit in name order, as a Node's location starts with its unit's name; then by rank);
    the star's centre is the best-ranked one. Then unit by unit, HOT_CHUNK members at a time (each unit's
    documents read once): each member's edge to the first committed member near it and to the centre. The
    committed members (incremental) are Nodes already, as read for the window."""
    ids, splits, units, docs = [], [], [], []
    for u, (_name, a) in enumerate(parts):
        m = a[a["key"] == np.uint64(key)]
        ids.append(m["doc_id"])
        splits.append(m["split"].astype(np.int16))
        docs.append(m["doc"])
        units.append(np.full(m.size, u, dtype=np.int32))
    ids, splits, units, docs = (np.concatenate(x) for x in (ids, splits, units, docs))
    committed = clusters.merge_copies(committed_nodes)
    if np.isin(ids, np.array([c.doc_id for c in committed], dtype=np.uint64)).any():  # not expected (exact
        nodes = member_nodes(plan, parts, ids, splits, units, docs, np.arange(ids.size))  # copies of committed
        yield from clusters.bucket_edges(nodes + committed_nodes, threshold)  # documents take no part): whole
        return
    order = np.lexsort((units, -splits, ids))
    first = np.ones(order.size, dtype=bool)
    first[1:] = ids[order][1:] != ids[order][:-1]
    pick = order[first]
    if not pick.size or pick.size + len(committed) < 2:
        return
    best = pick[np.lexsort((ids[pick], -splits[pick]))[0]]  # rank: the highest split, then the smallest id
    centre = member_nodes(plan, parts, ids, splits, units, docs, np.array([best]))[0]
    csig = centre.signature()
    committed_sigs = [c.signature() for c in committed]
    by_unit = pick[np.argsort(units[pick], kind="stable")]
    cuts = np.flatnonzero(np.diff(units[by_unit])) + 1
    for rows in np.split(by_unit, cuts):
        for start in range(0, rows.size, HOT_CHUNK):
            for m in member_nodes(plan, parts, ids, splits, units, docs, rows[start:start + HOT_CHUNK]):
                msig = m.signature()
                for c, sig in zip(committed, committed_sigs):
                    j = minhash.estimated_jaccard(sig, msig)
                    if j >= threshold:
                        yield clusters.Edge(c, m, j)
                        break
                if m.doc_id != centre.doc_id:
                    j = minhash.estimated_jaccard(csig, msig)
                    if j >= threshold:
                        yield clusters.Edge(centre, m, j)


def member_nodes(plan, parts, ids, splits, units, docs, picked) -> list:
    """Nodes of the bucket rows `picked`, in that order (each unit's signatures and documents read once)."""
    out: list = [None] * picked.size
    for u in np.unique(units[picked]).tolist():
        at = np.flatnonzero(units[picked] == u)
        rows = picked[at]
        name = parts[u][0]
        sigs = band_files.unit_sig_rows(plan, name, docs[rows].astype(np.int64))
        meta = pickle.loads(io_utils.read_bytes(paths.band_documents(plan.staging_dir, name)))
        for k, (i, r) in enumerate(zip(at.tolist(), rows.tolist())):
            doc_id, split = int(ids[r]), int(splits[r])
            source, loc = meta[int(docs[r])]
            out[i] = clusters.Node(clusters.rank(split, doc_id), doc_id, split, sigs[k].tobytes(), source, loc)
    return out


def read_shingles(staging_dir: str, loc: tuple) -> np.ndarray:
    _name, _line, start, count = loc
    with io_utils.open_read(paths.shingles(staging_dir, loc[0])) as f:
        f.seek(start * 8)
        return np.frombuffer(f.read(count * 8), dtype="<u8")


def verify(edge, plan):
    a, b, _estimate = edge
    if a.committed or b.committed:  # committed shingles are not kept: the estimate decided the edge
        yield edge
        return
    j = minhash.exact_jaccard(read_shingles(plan.staging_dir, a.loc), read_shingles(plan.staging_dir, b.loc))
    if j >= plan.config.near_dedup_config.threshold:
        yield clusters.Edge(a, b, j)
