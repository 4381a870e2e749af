"""`pileprep verify`, part 1 (pipeline/tools/verify.py): every file the manifest names, against it.

Every shard, dead-letter file, document-id index and near-dedup band index file the manifest names is hashed and
compared with the size and sha256 the manifest recorded (band index rows are also checked: whole rows, sorted,
keys in the file's range); each mismatch (missing, truncated, 0-byte, flipped byte, two shards swapped) is listed
by name. Paths go through the one resolver (`model_contract.resolve_shard_path`), which refuses paths outside the
dataset. Local, mounted and s3:// datasets alike (Beam FileSystems).
"""
from __future__ import annotations

import hashlib
from typing import Optional

import numpy as np

from model_contract import ContractError, Manifest
from model_contract.hashing import sha256_file
from model_contract.dataset_paths import resolve_dataset_path
from pipeline.tools.verify_report import VerifyReport
from transforms.io import io_utils


def _digest(path: str) -> tuple:
    return sha256_file(path, opener=io_utils.open_read)  # the shared hash, not the job's reader


def located(manifest_file: str, rel: str) -> str:
    return resolve_dataset_path(manifest_file, rel)


def _expected_files(manifest: Manifest, report: VerifyReport) -> list:
    """(kind, relative path, bytes, sha256) of every file the manifest names."""
    files = [("shard", s.path, s.bytes, s.sha256) for s in manifest.shards]
    recorded = {r.path: r for r in manifest.dead_letter_files or []}
    for rel in manifest.dead_letters:
        row = recorded.get(rel)
        if row is None:
            report.notes.append(f"dead letter {rel}: no size/sha256 recorded (manifest predates them); "
                                "checked that it exists")
            files.append(("dead letter", rel, None, None))
        else:
            files.append(("dead letter", rel, row.bytes, row.sha256))
    files += [("id index", r.path, r.bytes, r.sha256) for r in manifest.doc_id_indexes or []]
    return files


def check_files(manifest: Manifest, manifest_file: str, report: VerifyReport) -> None:
    check_band_indexes(manifest, manifest_file, report)
    for kind, rel, size, sha in _expected_files(manifest, report):
        try:
            path = located(manifest_file, rel)
        except ContractError as e:
            report.mismatches.append(f"{kind} {rel}: refused: {e}")
            continue
        try:  # no separate existence check: on object stores each call costs a client and a request
            got_size, got_sha = _digest(path)
        except Exception as e:  # noqa: BLE001 - FileNotFoundError locally, BeamIOError & co on object stores
            report.mismatches.append(f"{kind} {rel}: missing or unreadable ({type(e).__name__})")
            continue
        report.files_checked += 1
        report.bytes_checked += got_size
        if size is not None and got_size != size:
            report.mismatches.append(f"{kind} {rel}: {got_size} bytes, the manifest says {size}")
        elif sha is not None and got_sha != sha:
            report.mismatches.append(f"{kind} {rel}: sha256 {got_sha[:16]}…, the manifest says {sha[:16]}… "
                                     "(same size: flipped bytes or a swapped file)")


# ------------------------------------------------------------------------------------ near-dedup band index
BAND_INDEXES = "near_dedup_band_indexes"  # the manifest's list (pipeline/shard/near_dedup/manifest.py BAND_INDEXES)
_BAND_CHUNK_ROWS = 4096  # rows read at a time: a Pile-scale band file is tens of GB, never read whole


def _num_perm(manifest: Manifest) -> Optional[int]:
    """MinHash values per row: bands x rows of the config that built the dataset (an incremental run keeps the
    committed config, so every generation's files share it)."""
    cfg = manifest.config or {}
    minhash = (manifest.extra.get("near_dedup") or {}).get("minhash") or {}
    bands, rows = cfg.get("near_dedup_bands", minhash.get("bands")), cfg.get("near_dedup_rows", minhash.get("rows"))
    ok = isinstance(bands, int) and isinstance(rows, int) and bands > 0 and rows > 0
    return bands * rows if ok else None


def _band_rows_problem(rows: np.ndarray, first: int, previous: Optional[tuple], key_range: int,
                       ranges: int) -> Optional[str]:
    """The first malformed row of a chunk, as the incremental run's reader would refuse or misuse it
    (transforms/shard/near_dedup/band_index.py decode, pipeline/shard/near_dedup/windows.py committed_range_rows):
    keys of 63 bits in the file's range (the top 3 bits, band_index.py BAND_RANGES), (key, id) strictly
    increasing across the whole file, a split the contract knows."""
    from transforms.shard.documents import SPLITS  # noqa: PLC0415

    keys, ids, splits = rows["key"], rows["doc_id"], rows["split"]
    shift = np.uint64(63 - (ranges.bit_length() - 1))  # a key's range = key * ranges >> 63, ranges a power of 2
    outside = np.flatnonzero((keys >> shift) != np.uint64(key_range))
    if outside.size:
        return f"row {first + int(outside[0])}: band key {int(keys[outside[0]]):#x} outside range {key_range}"
    if previous is not None and (int(keys[0]), int(ids[0])) <= previous:
        return f"row {first}: not sorted by (band key, document id) after the previous row"
    later = (keys[1:] > keys[:-1]) | ((keys[1:] == keys[:-1]) & (ids[1:] > ids[:-1]))
    if not later.all():
        return f"row {first + 1 + int(np.flatnonzero(~later)[0])}: not sorted by (band key, document id)"
    bad_split = np.flatnonzero(splits >= len(SPLITS))
    if bad_split.size:
        return f"row {first + int(bad_split[0])}: split {int(splits[bad_split[0]])} is not one of {len(SPLITS)}"
    return None


def _scan_band_file(path: str, num_perm: Optional[int], key_range: int, ranges: int) -> tuple:
    """(bytes, sha256, first problem with the rows or None) in one streaming pass over the file."""
    from transforms.shard.near_dedup.band_index import row_dtype  # noqa: PLC0415

    dtype = row_dtype(num_perm) if num_perm else None
    h, size, pending, first, previous, problem = hashlib.sha256(), 0, b"", 0, None, None
    with io_utils.open_read(path) as f:
        while True:
            chunk = f.read((dtype.itemsize if dtype else 1) * _BAND_CHUNK_ROWS)
            if not chunk:
                break
            h.update(chunk)
            size += len(chunk)
            if dtype is None or problem is not None:
                continue
            pending += chunk
            whole = len(pending) - len(pending) % dtype.itemsize
            rows = np.frombuffer(pending[:whole], dtype=dtype)
            pending = pending[whole:]
            if rows.size:
                problem = _band_rows_problem(rows, first, previous, key_range, ranges)
                previous, first = (int(rows["key"][-1]), int(rows["doc_id"][-1])), first + rows.size
    if problem is None and dtype is not None and pending:
        problem = (f"{size} bytes is not a whole number of {dtype.itemsize}-byte rows (a band index of "
                   f"{num_perm} permutations)")
    return size, h.hexdigest(), problem


def check_band_indexes(manifest: Manifest, manifest_file: str, report: VerifyReport) -> None:
    """Every near-dedup band index file the manifest lists: size and sha256 as listed, then its rows well formed.
    A later `--incremental --near-dedup` run trusts these rows to keep near-copies of committed documents out;
    it checks them only when it reads them, so a damaged file would otherwise surface mid-run."""
    listed = manifest.band_indexes or []  # rows already checked field by field on load (model_contract/manifest.py)
    if not listed:
        return
    from transforms.shard.near_dedup.band_index import BAND_RANGES  # noqa: PLC0415

    num_perm = _num_perm(manifest)
    if num_perm is None:
        report.notes.append(f"{BAND_INDEXES}: the manifest names no near_dedup_bands / near_dedup_rows; band index "
                            "files checked by size and sha256 only")
    for i, row in enumerate(listed):
        rel, size, sha, key_range = row.path, row.bytes, row.sha256, row.range
        if not 0 <= key_range < BAND_RANGES:
            report.mismatches.append(f"band index {BAND_INDEXES}[{i}]: range {key_range} is not 0-{BAND_RANGES - 1}")
            continue
        try:
            path = located(manifest_file, rel)
        except ContractError as e:
            report.mismatches.append(f"band index {rel}: refused: {e}")
            continue
        try:
            got_size, got_sha, problem = _scan_band_file(path, num_perm, key_range, BAND_RANGES)
        except Exception as e:  # noqa: BLE001 - FileNotFoundError locally, BeamIOError & co on object stores
            report.mismatches.append(f"band index {rel}: missing or unreadable ({type(e).__name__})")
            continue
        report.files_checked += 1
        report.bytes_checked += got_size
        if got_size != size:
            report.mismatches.append(f"band index {rel}: {got_size} bytes, the manifest says {size}")
        elif got_sha != sha:
            report.mismatches.append(f"band index {rel}: sha256 {got_sha[:16]}…, the manifest says {sha[:16]}… "
                                     "(same size: flipped bytes or a swapped file)")
        elif problem is not None:
            report.mismatches.append(f"band index {rel}: {problem}")

