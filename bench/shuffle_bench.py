"""The two shuffles measured side by side on one corpus: read requests and bytes on the tokenized units' spill
files, wall time, and that the datasets are byte-identical (docs/SHUFFLE.md; bench/shuffle_sim.py computes the
same counts from the plan at 1 GB → 1 TB).

    python bench/shuffle_bench.py [--input 'DIR/train/*.jsonl.zst'] [--tokenizer MODEL] [--unit-mb 0.5]
                                  [--num-shards 32]

Runs the shard job twice in this process (FnApiRunner in memory, so every read is seen here): `--shuffle files`
(each pack task searches every unit's index and reads its range) and `--shuffle runner` (each unit read whole
once, pieces through a GroupByKey). A request is one read() call on a unit's .index or .tokens file (on S3
each is a ranged GET). Without --input, `pileprep sample` writes the corpus (24 MB of text).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from pipeline.config import ShardConfig  # noqa: E402
from pipeline.shard import shard_pipeline  # noqa: E402
from transforms.io import io_utils  # noqa: E402

IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
LLAMA2 = os.path.join(os.path.dirname(REPO), "shared", "data", "tokenizers", "llama2-bpe-32k.model")


class _Counting:
    """A file object that counts read() calls and bytes into `counts`, the held-out dedup pass apart."""

    def __init__(self, f, counts: dict, prefix: str):
        self._f, self._counts, self._prefix = f, counts, prefix

    def read(self, *args):
        data = self._f.read(*args)
        self._counts[self._prefix + "requests"] += 1
        self._counts[self._prefix + "bytes"] += len(data)
        return data

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


def run(config: ShardConfig) -> dict:
    counts = {"requests": 0, "bytes": 0, "dedup_requests": 0, "dedup_bytes": 0}
    original = io_utils.open_read

    def open_read(path):
        f = original(path)
        if "/units/" not in path.replace("\\", "/"):
            return f
        caller = sys._getframe(1)  # noqa: SLF001 - which stage reads: the dedup pass is the same in both designs
        dedup = any(fr.f_code.co_name == "index_held_out_ids" for fr in _frames(caller))
        return _Counting(f, counts, "dedup_" if dedup else "")

    io_utils.open_read = open_read
    try:
        t0 = time.monotonic()
        manifest = shard_pipeline.run(config, IN_MEMORY, progress_every_s=0)
        counts["wall_s"] = time.monotonic() - t0
    finally:
        io_utils.open_read = original
    counts["shards"] = len(manifest["shards"])
    return counts


def _frames(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


def _files(root: pathlib.Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "_staging" not in p.parts}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", default=None)
    ap.add_argument("--tokenizer", default=LLAMA2)
    ap.add_argument("--unit-mb", type=float, default=0.5)
    ap.add_argument("--num-shards", type=int, default=32)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="shuffle-bench-") as tmp:
        tmp = pathlib.Path(tmp)
        inputs = args.input
        if inputs is None:
            from pipeline.tools.sample_corpus import write_sample_corpus  # noqa: PLC0415

            write_sample_corpus(str(tmp / "corpus"))
            inputs = str(tmp / "corpus" / "train" / "*.jsonl.zst")
        results = {}
        for shuffle in ("files", "runner"):
            config = ShardConfig(inputs=(inputs,), output=str(tmp / shuffle), tokenizer=args.tokenizer,
                                 num_shards=args.num_shards, unit_mb=args.unit_mb, shuffle=shuffle)
            results[shuffle] = run(config)
        same = _files(tmp / "files") == _files(tmp / "runner")
    a, d = results["files"], results["runner"]
    print(f"unit-mb {args.unit_mb}, {a['shards']} shards, datasets byte-identical: {same}")
    print("| shuffle | unit-file reads to pack | bytes read | bytes/read | + held-out dedup pass: reads, bytes "
          "| wall s |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['requests']:,} | {r['bytes']:,} | {r['bytes'] / max(1, r['requests']):,.0f} "
              f"| {r['dedup_requests']:,}, {r['dedup_bytes']:,} | {r['wall_s']:.1f} |")
    print(f"runner / files: reads {d['requests'] / max(1, a['requests']):.4f}, "
          f"bytes {d['bytes'] / max(1, a['bytes']):.2f}, wall {d['wall_s'] / a['wall_s']:.2f}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
