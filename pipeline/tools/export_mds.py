"""MosaicML Streaming (MDS) from a committed dataset: per split a directory `<split>/` of `shard.NNNNN.mds` files
and the `index.json` `streaming.StreamingDataset` opens, with each file's sha1 (MDS's own hash) in it.

The packed examples in shard order, as MDSWriter (streaming/base/format/mds/writer.py) writes them, without
compression: columns in name order, input_ids / positions / segment_ids as `ndarray:int32:<seq_len>` (fixed
size), piece_doc_ids / piece_offsets as `ndarray:int64` (a shape header per sample: ndim << 2 | the smallest uint
code for the shape, the shape, the values). A file is `num_samples` (uint32), the samples' offsets (uint32,
n + 1), the writer config as sorted JSON, the samples; a file is closed before it passes `SIZE_LIMIT` bytes
(MDS's default, and its offsets are uint32). Written here with numpy rather than by importing `streaming`, so
the export needs nothing beyond numpy; tests read it back with `streaming.StreamingDataset`.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

from model_contract import (INPUT_IDS, PIECE_DOC_IDS, PIECE_OFFSETS, POSITIONS, SEGMENT_IDS, decode_example,
                            resolve_shard_path)
from model_contract.checked_reader import iter_checked_records
from transforms.io import io_utils

VERSION = 1
SIZE_LIMIT = 1 << 26
FIXED = (INPUT_IDS, POSITIONS, SEGMENT_IDS)
PIECES = (PIECE_DOC_IDS, PIECE_OFFSETS)
_SHAPE_CODES = ((1 << 8, 0, np.uint8), (1 << 16, 1, np.uint16), (1 << 32, 2, np.uint32))


def columns(seq_len: int) -> list:
    """(name, encoding, size) in MDS's column order (sorted names)."""
    cols = [(n, f"ndarray:int32:{seq_len}", seq_len * 4) for n in FIXED] + [(n, "ndarray:int64", None) for n in PIECES]
    return sorted(cols)


def config(seq_len: int) -> dict:
    cols = columns(seq_len)
    return {"column_encodings": [c[1] for c in cols], "column_names": [c[0] for c in cols],
            "column_sizes": [c[2] for c in cols], "compression": None, "format": "mds", "hashes": ["sha1"],
            "size_limit": SIZE_LIMIT, "version": 2}


def _dynamic(values: np.ndarray) -> bytes:
    """MDS's `ndarray:int64` of a 1-D array (its shape in the sample)."""
    n = values.size
    if n == 0:
        raise ValueError("MDS cannot hold an empty array: an example without pieces")
    _limit, code, dtype = next(s for s in _SHAPE_CODES if n < s[0])
    return bytes([(1 << 2) | code]) + np.array([n], dtype=dtype).tobytes() + values.astype("<i8").tobytes()


def encode_sample(example: dict, seq_len: int) -> bytes:
    sizes, data = [], []
    for name, _encoding, size in columns(seq_len):
        if size is None:
            datum = _dynamic(example[name])
            sizes.append(len(datum))
        else:
            datum = example[name].astype("<i4").tobytes()
            if len(datum) != size:
                raise ValueError(f"{name}: {len(datum)} bytes, not {size}")
        data.append(datum)
    return np.array(sizes, dtype="<u4").tobytes() + b"".join(data)


def shard_bytes(samples: list, config_data: bytes) -> bytes:
    offsets = np.array([0] + [len(s) for s in samples], dtype=np.int64).cumsum()
    offsets += 4 + 4 * (len(samples) + 1) + len(config_data)
    if offsets[-1] >= 1 << 32:
        raise ValueError("an MDS file over 4 GiB")
    return np.uint32(len(samples)).tobytes() + offsets.astype("<u4").tobytes() + config_data + b"".join(samples)


def write_split(job) -> list:
    seq_len = job.manifest.contract.seq_len
    conf = config(seq_len)
    config_data = json.dumps(conf, sort_keys=True).encode("utf-8")
    rows, index = [], []
    samples: list = []
    size = 8 + len(config_data)

    def flush():
        data = shard_bytes(samples, config_data)
        name = f"shard.{len(index):05d}.mds"

        def fill(tmp: str) -> None:
            with open(tmp, "wb") as f:
                f.write(data)

        rows.append(job.put(f"{job.split}/{name}", fill))
        index.append({**conf, "samples": len(samples), "zip_data": None,
                      "raw_data": {"basename": name, "bytes": len(data),
                                   "hashes": {"sha1": hashlib.sha1(data).hexdigest()}}})

    for shard in job.shards:
        with io_utils.open_read(resolve_shard_path(job.manifest_file, shard)) as f:
            for record in iter_checked_records(f, shard):
                sample = encode_sample(decode_example(record), seq_len)
                if samples and size + len(sample) + 4 > SIZE_LIMIT:
                    flush()
                    samples, size = [], 8 + len(config_data)
                samples.append(sample)
                size += len(sample) + 4
    if samples or not index:
        flush()
    text = json.dumps({"shards": index, "version": 2}, sort_keys=True)

    def fill_index(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    rows.append(job.put(f"{job.split}/index.json", fill_index))
    return rows


def finish(job, splits: list, files: list) -> list:
    return []
