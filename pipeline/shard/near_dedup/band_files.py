"""The files shuffle's staged band rows: each unit's rows cut into one file per band-key range (so a key-range
task reads only its own) and their fine window offsets (so it reads a window of them at a time), the unit's
signature table and its documents' (source, location). Written by the signing step (sign.py), read by the
edges (edges.py) and the band index (band_index_writer.py), window by window (windows.py).
"""
from __future__ import annotations

import pickle

import numpy as np

from pipeline.errors import RunError
from transforms.io import io_utils
from transforms.shard.near_dedup import minhash, paths
from transforms.shard.near_dedup.band_index import BAND_RANGES

# A staged band row: the key, the document's id and split, and its row in the unit's staged signatures.
BAND_ROW = np.dtype([("key", "<u8"), ("doc_id", "<u8"), ("split", "u1"), ("doc", "<u4")])


# Bounded memory (docs/NEAR_DEDUP.md "Memory, files shuffle"): a key-range task holds at most about WINDOW_ROWS
# band rows at once. Each range's keys are cut into WINDOW_GRAIN fine windows of equal key width (keys are
# uniform 63-bit hashes); the task groups consecutive fine windows into windows of at most WINDOW_ROWS rows (a
# fine window alone may exceed it: a hot key, or a corpus over ~WINDOW_GRAIN x WINDOW_ROWS x BAND_RANGES band
# rows) and works window by window, in key order. A band bucket is one key, so it never spans two windows: the
# same buckets, edges and band index bytes as one window per range. The band index holds ~417 bytes per row of
# a window (its signature), so 1M rows is ~0.4 GB of output rows at a time (plus the rows and their signatures).
WINDOW_ROWS = 1 << 20
WINDOW_GRAIN = 4096  # fine windows per key range; the unit stage writes their offsets, tasks group them


def fine_bounds() -> np.ndarray:
    """The lowest key of every fine window of every range, and 2^63 last: BAND_RANGES x WINDOW_GRAIN + 1."""
    total = BAND_RANGES * WINDOW_GRAIN
    shift = 63 - (total.bit_length() - 1)
    return np.arange(total + 1, dtype=np.uint64) << np.uint64(shift)


def write_band_files(staging_dir: str, unit_name: str, docs: list, sigs: np.ndarray, keys: np.ndarray):
    """A unit's band rows (`docs`: its DocRefs, row for row with `sigs` and `keys`), one file per key range, each sorted by (key, row), plus the unit's signatures (once
    per document, not once per band row), its documents' (source, location), read only for documents that
    share a bucket, and its window offsets (paths.window_offsets). A retried bundle rewrites the same bytes.
    Per range, so that each key-range task reads only its own rows (the edges and the band index read them
    2 x BAND_RANGES times), and only a window of them at a time."""
    n, bands = keys.shape[0], keys.shape[1] if keys.ndim == 2 else 0
    rows = np.zeros(n * bands, dtype=BAND_ROW)
    rows["key"] = keys.reshape(-1)
    rows["doc"] = np.repeat(np.arange(n, dtype=np.uint32), bands)
    rows["doc_id"] = np.repeat(np.array([d.doc_id for d in docs], dtype=np.uint64), bands)
    rows["split"] = np.repeat(np.array([d.split for d in docs], dtype=np.uint8), bands)
    rows = rows[np.lexsort((rows["doc"], rows["key"]))]
    ranges = (rows["key"] >> np.uint64(63 - (BAND_RANGES.bit_length() - 1))).astype(np.int64)  # the key's top bits
    cuts = np.searchsorted(ranges, np.arange(BAND_RANGES + 1))
    # the first row at or above each fine window's lowest key, relative to its range file's first row
    at = np.searchsorted(rows["key"], fine_bounds()).reshape(-1)
    offsets = np.stack([at[r * WINDOW_GRAIN:(r + 1) * WINDOW_GRAIN + 1] - cuts[r] for r in range(BAND_RANGES)])
    if offsets.size and int(offsets.max()) >= 1 << 32:
        raise RunError(f"{unit_name}: over 2^32 band rows in one key range (split the input into smaller units)")
    io_utils.write_bytes(paths.band_signatures(staging_dir, unit_name), np.ascontiguousarray(sigs, "<u4").tobytes())
    io_utils.write_bytes(paths.band_documents(staging_dir, unit_name),
                         pickle.dumps([(d.source, d.loc) for d in docs], protocol=4))
    io_utils.write_bytes(paths.window_offsets(staging_dir, unit_name), offsets.astype("<u4").tobytes())
    for r in range(BAND_RANGES):
        io_utils.write_bytes(paths.band_rows(staging_dir, unit_name, r), rows[cuts[r]:cuts[r + 1]].tobytes())


def unit_offsets(plan, name: str, r: int) -> np.ndarray:
    """Range r's fine window offsets of one unit (paths.window_offsets): WINDOW_GRAIN + 1 rows, int64."""
    width = (WINDOW_GRAIN + 1) * 4
    with io_utils.open_read(paths.window_offsets(plan.staging_dir, name)) as f:
        f.seek(r * width)
        data = f.read(width)
    if len(data) != width:
        raise IOError(f"{name}: near-dedup window offsets cut short (staging damaged)")
    return np.frombuffer(data, dtype="<u4").astype(np.int64)


def read_rows(path: str, start: int, stop: int, dtype: np.dtype) -> np.ndarray:
    """Rows [start, stop) of a file of fixed-size rows, by one ranged read."""
    if stop <= start:
        return np.zeros(0, dtype=dtype)
    with io_utils.open_read(path) as f:
        f.seek(start * dtype.itemsize)
        data = f.read((stop - start) * dtype.itemsize)
    if len(data) != (stop - start) * dtype.itemsize:
        raise IOError(f"{path}: cut short at row {start + len(data) // dtype.itemsize} of {stop} (staging damaged)")
    return np.frombuffer(data, dtype=dtype)


def window_cuts(counts: np.ndarray, cap: int) -> list:
    """Fine window indices where windows start, and WINDOW_GRAIN last: consecutive fine windows grouped while
    their rows stay within `cap` (a fine window over it stands alone)."""
    cuts, held = [0], 0
    for i, n in enumerate(counts.tolist()):
        if held and held + n > cap:
            cuts.append(i)
            held = 0
        held += n
    cuts.append(len(counts))
    return cuts


def unit_sigs(plan, name: str) -> np.ndarray:
    num_perm = plan.config.near_dedup_config.params.num_perm
    return np.frombuffer(io_utils.read_bytes(paths.band_signatures(plan.staging_dir, name)),
                         dtype=minhash.SIGNATURE_DTYPE).reshape(-1, num_perm)


def unit_sig_rows(plan, name: str, docs: np.ndarray) -> np.ndarray:
    """The signatures of rows `docs` of a unit's staged signature table. Local paths (EFS/FSx too) are mapped,
    so only the pages of those rows are read and nothing but the rows is held; elsewhere the table is read
    (bounded by a unit's size)."""
    num_perm = plan.config.near_dedup_config.params.num_perm
    if docs.size == 0:
        return np.zeros((0, num_perm), dtype=minhash.SIGNATURE_DTYPE)
    path = paths.band_signatures(plan.staging_dir, name)
    if not io_utils.is_local(path):
        return unit_sigs(plan, name)[docs]
    table = np.memmap(path, dtype=minhash.SIGNATURE_DTYPE, mode="r").reshape(-1, num_perm)
    try:
        return np.array(table[docs])
    finally:
        del table

