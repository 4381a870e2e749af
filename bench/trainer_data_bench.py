"""Cost of the trainer's shard checks and loader on a synthetic dataset (run: python bench/trainer_data_bench.py).

Reports, for the same files in one run: sha256 hashing (--verify-data) and plain sequential reading (the floor
for any full check) in MB/s, the one-time record-offset walk in MB/s of shard covered, and the loader's steady
examples/s with the bytes it read per byte of the records it trained on (1.0 = no read amplification).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.trainer_fixtures import write_dataset  # noqa: E402
from trainer.config import DataConfig  # noqa: E402
from trainer.data import ShardLoader  # noqa: E402
from trainer.dataset import read_manifest  # noqa: E402
from trainer.shard_files import sha256_file, shard_offsets  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=60000)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=50)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = write_dataset(os.path.join(tmp, "data"), seq_len=a.seq_len, vocab=50000, n_docs=a.docs, n_shards=4,
                          min_len=50, max_len=2000)
        manifest, mfile = read_manifest(DataConfig(path=d))
        shards = manifest.shards
        paths = [os.path.join(d, s.path) for s in shards]
        total = sum(s.bytes for s in shards)
        out = {"dataset_mb": total / 1e6, "examples": sum(s.examples for s in shards)}
        t0 = time.perf_counter()
        for p in paths:
            with open(p, "rb", buffering=0) as f:
                while f.read(8 << 20):
                    pass
        out["read_mb_s"] = total / 1e6 / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for p in paths:
            sha256_file(p)
        out["sha256_mb_s"] = total / 1e6 / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for p, s in zip(paths, shards):
            shard_offsets(p, s, None)
        out["offset_walk_mb_s"] = total / 1e6 / (time.perf_counter() - t0)
        cfg = DataConfig(path=d, streams=a.streams, shuffle_buffer=64, index_dir=os.path.join(tmp, "idx"),
                         prefetch=0)
        loader = ShardLoader(manifest, mfile, cfg, a.seq_len, a.global_batch)
        next(loader)
        t0, b0 = time.perf_counter(), loader.bytes_read
        for _ in range(a.steps):
            next(loader)
        dt = time.perf_counter() - t0
        per_record = total / out["examples"]
        out["loader_examples_s"] = a.steps * a.global_batch / dt
        out["loader_read_amplification"] = (loader.bytes_read - b0) / (a.steps * a.global_batch * per_record)
        out["pile_1.5TB_sha256_minutes_one_core"] = 1.5e6 / out["sha256_mb_s"] / 60
        loader.close()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
