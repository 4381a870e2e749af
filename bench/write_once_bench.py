"""Cost of writing every output file once (temp name + rename, transforms/io_utils.open_write) against Beam's
FileSystems.create writing in place, in the same run: N files of SIZE MiB each, 1 MiB writes, then fsync.

    python bench/write_once_bench.py --files 20 --mib 16 --dir /tmp/wob
"""
from __future__ import annotations

import argparse
import os
import shutil
import time

from apache_beam.io.filesystems import FileSystems

from transforms.io import io_utils


def _write(open_fn, directory: str, files: int, mib: int) -> float:
    block = os.urandom(1 << 20)
    paths = [os.path.join(directory, f"shard-{i:05d}.tfrecord") for i in range(files)]
    t0 = time.perf_counter()
    for p in paths:
        with open_fn(p) as f:
            for _ in range(mib):
                f.write(block)
    io_utils.fsync_files(paths)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=20)
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--dir", default="/tmp/pileprep-write-once-bench")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    best = {"in_place": float("inf"), "write_once": float("inf")}
    for _ in range(a.repeats):
        for name, fn in (("in_place", lambda p: FileSystems.create(p, compression_type="uncompressed")),
                         ("write_once", io_utils.open_write)):
            shutil.rmtree(a.dir, ignore_errors=True)
            os.makedirs(a.dir)
            best[name] = min(best[name], _write(fn, a.dir, a.files, a.mib))
    shutil.rmtree(a.dir, ignore_errors=True)
    total = a.files * a.mib
    for name, t in best.items():
        print(f"{name:<11} {total} MiB in {t:.3f}s  {total / t:.0f} MiB/s")
    print(f"write_once / in_place wall: {best['write_once'] / best['in_place']:.3f}")


if __name__ == "__main__":
    main()
