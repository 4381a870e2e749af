"""--incremental --near-dedup: the committed generations' band index files, as the committed manifest lists
them (paths checked, every generation holding one, the same shingle kind) and as a reader trusts them (size and
sha256 streamed against the manifest's row before a row is used: a damaged or swapped index would keep
near-copies of committed documents, or remove documents for a partner nobody reads)."""
from __future__ import annotations

import hashlib

from pipeline.errors import ConfigError, RunError
from pipeline.shard import integrity
from pipeline.shard.near_dedup.elements import CommittedBandFile
from pipeline.shard.near_dedup.manifest import BAND_INDEXES
from transforms.io import io_utils
from transforms.shard.near_dedup import band_index, shingling
from transforms.shard.near_dedup.band_index import BAND_RANGES


def committed_bound(f, n: int, row_size: int, key: int) -> int:
    """The first row of an open committed band index file (n rows sorted by key) whose key is >= key: a binary
    search by ranged reads of the rows' keys."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        f.seek(mid * row_size)
        data = f.read(8)
        if len(data) != 8:
            raise ValueError(f"cut short at row {mid}")
        if int.from_bytes(data, "little") < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


def committed_checked(entry: CommittedBandFile, num_perm: int) -> int:
    """A committed band index file's row count, once its size and sha256 (streamed, not held) match its manifest
    row: band_index.checked_bytes without the whole file in memory."""
    what = f"{BAND_INDEXES} {entry.rel}"
    sha, size = hashlib.sha256(), 0
    with io_utils.open_read(entry.path) as f:
        while True:
            block = f.read(1 << 24)
            if not block:
                break
            sha.update(block)
            size += len(block)
    if size != int(entry.bytes) or sha.hexdigest() != entry.sha256:
        raise ValueError(f"{what}: {size} bytes, sha256 {sha.hexdigest()[:12]}..., but the manifest lists "
                         f"{entry.bytes} bytes, sha256 {str(entry.sha256)[:12]}...")
    item = band_index.row_dtype(num_perm).itemsize
    if size % item:
        raise ValueError(f"{what}: {size} bytes is not a whole number of {item}-byte rows "
                         f"(a band index of {num_perm} permutations)")
    return size // item


def unusable(e) -> RunError:
    return RunError(f"--incremental --near-dedup: committed band index unusable: {e}; rebuild the dataset "
                    "without --incremental")


def committed_shingles(previous) -> str:
    """The shingle kind the committed dataset's band index was built with: its config's `near_dedup_shingles`,
    absent at the default (pipeline/config.py to_manifest_dict drops it, as in datasets built before it)."""
    return str(dict(previous.config).get("near_dedup_shingles", shingling.DEFAULT_SHINGLES))


def committed_band_indexes(previous, output_dir: str, shingles: str = shingling.DEFAULT_SHINGLES) -> list:
    """Every committed generation's band index files, paths validated: [CommittedBandFile]. A generation without one (built before band indexes were written) cannot be checked, and
    skipping it would keep near-copies of its documents: a configuration error naming the fix. Signatures of
    word and token shingles never agree, so new documents signed with another kind than the committed band
    index would match none of its documents: refused, naming the option."""
    from model_contract import MANIFEST_NAME  # noqa: PLC0415
    from model_contract.dataset_paths import resolve_dataset_path  # noqa: PLC0415
    from model_contract.schema import is_generation_name  # noqa: PLC0415

    if previous is None:
        return []
    if committed_shingles(previous) != shingles:
        raise ConfigError(f"--incremental --near-dedup: --near-dedup-shingles {shingles} differs from the committed "
                          f"dataset's ({committed_shingles(previous)}) in {output_dir}: its band index could not match "
                          f"new documents; run with --near-dedup-shingles {committed_shingles(previous)} or rebuild "
                          "without --incremental")
    rows = list(previous.band_indexes or [])  # BandIndexRow (model_contract/manifest.py), checked on load
    manifest_file = io_utils.join(output_dir, MANIFEST_NAME)
    out = []
    for i, row in enumerate(rows):
        what = f"{BAND_INDEXES}[{i}]"
        rel, generation = str(row.path), str(row.generation)
        if (not is_generation_name(generation) or rel.split("/", 1)[0] != generation
                or not isinstance(row.range, int) or not 0 <= row.range < BAND_RANGES
                or not isinstance(row.bytes, int) or not isinstance(row.sha256, str)):
            raise ConfigError(f"--incremental --near-dedup: the committed manifest's {what} is malformed "
                              "(generation, path inside it, range, bytes, sha256); rebuild without --incremental")
        try:
            path = resolve_dataset_path(manifest_file, rel, f"{what}.path")
        except ValueError as e:  # ContractError: a path that leaves the dataset directory
            raise ConfigError(f"--incremental --near-dedup: {e}; rebuild without --incremental") from None
        out.append(CommittedBandFile(generation, rel, row.range, row.bytes, row.sha256, path))
    held = {e.generation for e in out}
    missing = sorted({g["name"] for g in integrity.generations_of(previous)} - held)
    if missing:
        raise ConfigError(f"--incremental --near-dedup: generation(s) {', '.join(missing)} of {output_dir} have no "
                          "band index (built without --near-dedup or by an older pileprep), so new documents "
                          "cannot be checked against them; rebuild the dataset without --incremental once")
    return out
