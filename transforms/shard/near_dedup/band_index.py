"""A generation's band index: the LSH band keys of the documents it kept, for later --incremental runs.

Every generation built with --near-dedup writes, inside its directory, one file per band-key range
(BAND_RANGES, the key's top bits): `near-dedup/band-index-rNN.bin` (paths.py), fixed-size
little-endian rows (band key, document id, split, MinHash signature) sorted by (key, id). Only kept documents
are listed (near-copies and contaminated documents removed by the generation are not), so a new document that
matches a row is near a document readers actually see. The signature travels in the row so that a candidate is
verified against the committed document exactly as a full build verifies a pair (estimated Jaccard); committed
shingles are not kept, so --near-dedup-verify checks new-vs-committed pairs by the estimate.

The manifest lists each file with its size and sha256 (`near_dedup_band_indexes`); a reader checks both before
using a row. Pure functions: encoding, decoding and the rows → Node mapping.
"""
from __future__ import annotations

import hashlib
from typing import Optional

import numpy as np

from transforms.shard.near_dedup.clusters import Node, rank
from transforms.shard.near_dedup.minhash import SIGNATURE_DTYPE

BAND_RANGES = 8  # band keys are cut into this many ranges (their top bits): one file, and one task, each


def row_dtype(num_perm: int) -> np.dtype:
    return np.dtype([("key", "<u8"), ("doc_id", "<u8"), ("split", "u1"), ("sig", "<u4", (num_perm,))])


def encode(rows: list, num_perm: int) -> bytes:
    """[(band key, Node)] of kept documents → the file's bytes, sorted by (key, id), one row per (key, id)."""
    best: dict = {}
    for k, n in rows:  # copies of one id in several units: the one exact dedup keeps (highest split)
        cur = best.get((int(k), n.doc_id))
        if cur is None or (n.rank, n.loc) < (cur.rank, cur.loc):
            best[(int(k), n.doc_id)] = n
    unique = sorted(best.items())
    out = np.zeros(len(unique), dtype=row_dtype(num_perm))
    for i, ((key, doc_id), node) in enumerate(unique):
        out[i] = (key, doc_id, node.split, node.signature())
    return out.tobytes()


def encode_arrays(keys: np.ndarray, ids: np.ndarray, splits: np.ndarray, sigs: np.ndarray, num_perm: int,
                  sig_rows: Optional[np.ndarray] = None) -> bytes:
    """`encode` of rows given as arrays (the shard job's staged band rows): the same bytes. Copies of one id
    (several units) share their text, hence signature; the row keeps the highest split (exact dedup's copy).
    Row i's signature is `sigs[sig_rows[i]]` (default `sigs[i]`): the job passes its units' signature tables
    once per document, not once per band row. Signatures are gathered once, straight into the rows (they are
    ~95% of the bytes; gathering them per step cost half the band index's CPU)."""
    order = np.lexsort((-splits.astype(np.int16), ids, keys))
    sorted_keys, sorted_ids = keys[order], ids[order]
    first = np.ones(keys.size, dtype=bool)
    first[1:] = (sorted_keys[1:] != sorted_keys[:-1]) | (sorted_ids[1:] != sorted_ids[:-1])
    chosen = order[first]
    out = np.zeros(chosen.size, dtype=row_dtype(num_perm))
    out["key"], out["doc_id"], out["split"] = keys[chosen], ids[chosen], splits[chosen]
    out["sig"] = sigs[chosen if sig_rows is None else sig_rows[chosen]]
    return out.tobytes()


def decode(data: bytes, num_perm: int, what: str) -> np.ndarray:
    dtype = row_dtype(num_perm)
    if len(data) % dtype.itemsize:
        raise ValueError(f"{what}: {len(data)} bytes is not a whole number of {dtype.itemsize}-byte rows "
                         f"(a band index of {num_perm} permutations)")
    rows = np.frombuffer(data, dtype=dtype)
    order = np.lexsort((rows["doc_id"], rows["key"]))
    if rows.size and not np.array_equal(order, np.arange(rows.size)):
        raise ValueError(f"{what}: rows are not sorted by band key")
    return rows


def checked_bytes(data: bytes, expected_bytes: int, expected_sha256: str, what: str) -> bytes:
    """The file's bytes, refused unless size and sha256 match the manifest (a damaged or swapped index would
    silently keep near-copies of committed documents, or remove documents for a partner nobody reads)."""
    sha = hashlib.sha256(data).hexdigest()
    if len(data) != int(expected_bytes) or sha != expected_sha256:
        raise ValueError(f"{what}: {len(data)} bytes, sha256 {sha[:12]}..., but the manifest lists "
                         f"{expected_bytes} bytes, sha256 {str(expected_sha256)[:12]}...")
    return data


def committed_nodes(rows: np.ndarray, generation: str) -> list:
    """[(band key, Node)] for a committed generation's rows: Nodes that outrank every new document."""
    out = []
    for r in rows:
        doc_id, split = int(r["doc_id"]), int(r["split"])
        node = Node(rank(split, doc_id, committed=True), doc_id, split,
                    np.ascontiguousarray(r["sig"], dtype=SIGNATURE_DTYPE).tobytes(),
                    "", ("committed", generation), "", True)
        out.append((int(r["key"]), node))
    return out
