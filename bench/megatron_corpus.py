"""The 1.5 GB corpus of issue 30: 16 distinct copies of the 96 MB Pile-like sample (bench/megatron_side_by_side.py).

    python bench/megatron_corpus.py [--cache-dir DIR] [--copies 16] [--base-mb 96]

`pileprep sample --size-mb 96` (bench/shard_bench.py's build_corpus, cached in DIR) is the base; copy j of it
(j = 0 … 15) holds every base document, copy 0 unchanged and copy j >= 1 with one trailing line
`# pileprep bench copy j` appended to the text and `"bench_copy": j` in its meta: the sample generator's own way
of making copies (pipeline/tools/sample_corpus.py, COPY_MARKER), so every document of the 1.5 GB corpus is
distinct and exact dedup keeps all of them. The generator has no seed, and its text is the installation's (the
384 MB sample is mostly installed packages' code): copies are the only way to 1.5 GB of the same mix.

Layout: the Pile's, as the bench reads it (shard_bench.corpus_files): `train/<jj>-<ii>.jsonl.zst` (copy jj of
base train file ii, 128 files), `val.jsonl.zst` and `test.jsonl.zst` (the 16 copies of the base's, one after the
other). Built under `DIR/corpus-<copies>x<base>mb` (corpus-16x96mb) with a stamp naming the base's stamp, so a
rebuilt base (a changed installation) rebuilds it; nothing goes in the repository. On disk: ~0.35 GB of
.jsonl.zst plus the plain .jsonl the bench writes for Megatron (1.5 GB); built in ~1 minute.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import sys
import time

import zstandard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shard_bench import REPO, _installation_fingerprint, build_corpus, corpus_files  # noqa: E402

MARKER = "\n# pileprep bench copy {j}\n"
VERSION = 1  # bump when the copies' bytes change
ZSTD_LEVEL = 3  # the sample generator's


def _copy_lines(path: str, j: int):
    """The JSON lines of one base file as copy j: unchanged for j = 0, else with the marker and meta added."""
    with open(path, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as raw:
        for line in io.BufferedReader(raw, 1 << 20):
            if j == 0:
                yield line
                continue
            record = json.loads(line)
            record["text"] += MARKER.format(j=j)
            record.setdefault("meta", {})["bench_copy"] = j
            yield (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")


def _write(dest: str, sources: list) -> tuple:
    """Write the copies [(base file, j), ...] one after the other into dest (.jsonl.zst): (documents, bytes)."""
    docs = n_bytes = 0
    with open(dest + ".tmp", "wb") as f, zstandard.ZstdCompressor(level=ZSTD_LEVEL).stream_writer(f) as out:
        for path, j in sources:
            for line in _copy_lines(path, j):
                out.write(line)
                docs += 1
                n_bytes += len(line)
    os.replace(dest + ".tmp", dest)
    return docs, n_bytes


def _stamp_of(root: str) -> str:
    with open(os.path.join(root, ".bench-stamp.json"), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _saved(stamp: str) -> dict:
    """The stamp an earlier build left ({} when there is none)."""
    try:
        with open(stamp) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def build_copies_corpus(cache_dir: str, copies: int = 16, base_mb: int = 96, fingerprint: str | None = None) -> dict:
    """`copies` distinct copies of the `base_mb` sample under cache_dir/corpus-<copies>x<base_mb>mb (cached):
    a summary with output_dir and base (the sample's root)."""
    base = build_corpus(cache_dir, base_mb, fingerprint or _installation_fingerprint(), rebuild=False)
    root = os.path.join(cache_dir, f"corpus-{copies}x{base_mb}mb")
    stamp = os.path.join(root, ".bench-stamp.json")
    key = {"base": _stamp_of(base["output_dir"]), "copies": copies, "version": VERSION}
    saved = _saved(stamp)
    if saved.get("key") == key:
        return dict(saved["summary"], reused=True, output_dir=root)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "train"))
    start = time.perf_counter()
    files = corpus_files(base["output_dir"])
    docs = n_bytes = 0
    for j in range(copies):
        for path in files["train"]:
            name = os.path.basename(path)
            d, b = _write(os.path.join(root, "train", f"{j:02d}-{name}"), [(path, j)])
            docs, n_bytes = docs + d, n_bytes + b
    for split in ("val", "test"):
        d, b = _write(os.path.join(root, f"{split}.jsonl.zst"), [(files[split], j) for j in range(copies)])
        docs, n_bytes = docs + d, n_bytes + b
    summary = {"output_dir": root, "documents": docs, "uncompressed_bytes": n_bytes, "copies": copies,
               "base": base["output_dir"], "build_s": time.perf_counter() - start}
    with open(stamp + ".tmp", "w") as f:
        json.dump({"key": key, "summary": summary}, f)
    os.replace(stamp + ".tmp", stamp)
    summary["reused"] = False
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache-dir", default=os.path.join(REPO, "out", "bench"))
    p.add_argument("--copies", type=int, default=16)
    p.add_argument("--base-mb", type=int, default=96)
    args = p.parse_args(argv)
    print(json.dumps(build_copies_corpus(args.cache_dir, args.copies, args.base_mb), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
