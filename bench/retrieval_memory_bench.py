"""Peak RSS of the largest worker of the range-sharded neighbour search (pipeline/retrieval/sharded.py) at 1x and
4x the database, with 4x the ranges at 4x (so one range stays the same size), against loading the whole index
in one worker (what `retrieval neighbours` did before the ranges).

    nice -n 10 python bench/retrieval_memory_bench.py [--base 1000000] [--dim 64] [--queries 2000]

Synthetic clustered unit vectors (this measures memory only, never recall), IVF<n>,SQ8 codes. Each measured
search runs in its own process (FnApiRunner, one worker: that process is the worker), after the index was built
and cut into ranges by another process, so its ru_maxrss is the search's own peak.

    nice -n 10 python bench/retrieval_memory_bench.py --db-rows [--db-base 500000]

`retrieval neighbours --ranges`' other workers: a synthetic chunk database (Parquet shards of 250,000 rows,
32-token chunks, random tokens) at 1x and 4x; one process computes a query worker's exclusions
(pipeline/retrieval/db_rows.py `exclusions`, 2,000 query chunks) and a sidecar writer's rows (`NeededRows`,
4,000 rows and their continuations) by row group, another loads the database whole (store.ChunkDatabase,
what those workers did before).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

CHUNK = 250_000


def vectors(n: int, dim: int, seed: int):
    """Chunks of seeded clustered unit vectors (the same rows for the same n, dim, seed)."""
    centres = np.random.default_rng(seed).standard_normal((256, dim)).astype(np.float32)
    for c, a in enumerate(range(0, n, CHUNK)):
        rng = np.random.default_rng([seed, c])
        m = min(CHUNK, n - a)
        x = centres[rng.integers(0, 256, m)] + 0.4 * rng.standard_normal((m, dim)).astype(np.float32)
        yield x / np.linalg.norm(x, axis=1, keepdims=True)


def build(n: int, dim: int, ranges: int, out: str, nlist: int) -> dict:
    from pipeline.retrieval import sharded  # noqa: PLC0415
    from transforms.retrieval import retrieval_index  # noqa: PLC0415
    from transforms.retrieval.retrieval_index import IndexConfig  # noqa: PLC0415

    t = time.perf_counter()
    sample = next(vectors(min(n, 50_000), dim, 0))
    trained = retrieval_index.serialize(retrieval_index.train_index(dim, IndexConfig(f"IVF{nlist},SQ8"), sample))
    index = retrieval_index.deserialize(trained)
    os.makedirs(out, exist_ok=True)
    mm = np.lib.format.open_memmap(os.path.join(out, "vectors.npy"), mode="w+", dtype=np.float16, shape=(n, dim))
    first = 0
    for x in vectors(n, dim, 0):
        index.add_with_ids(x, np.arange(first, first + len(x), dtype=np.int64))
        mm[first:first + len(x)] = x
        first += len(x)
    mm.flush()
    del mm
    sharded.write_ranges(index, None, out, ranges)
    return {"build_s": round(time.perf_counter() - t, 1), "index_bytes": len(retrieval_index.serialize(index))}


def search(out: str, ranges: int, queries: int, dim: int, whole: bool) -> dict:
    import apache_beam as beam  # noqa: PLC0415
    from apache_beam.options.pipeline_options import PipelineOptions  # noqa: PLC0415

    from pipeline.retrieval import sharded  # noqa: PLC0415
    from transforms.retrieval import retrieval_index  # noqa: PLC0415

    q = next(vectors(queries, dim, 7))
    elems = [((0, i, 0), q[i], (((i * 8, i * 8 + 8),), ())) for i in range(queries)]
    t = time.perf_counter()
    if whole:  # the old way: every range merged into one index in the worker
        parts = [open(sharded.range_file(out, r), "rb").read() for r in range(ranges)]
        index = retrieval_index.merge_parts(parts[0], parts[1:])
        from transforms.retrieval.retrieval_index import Exclusion  # noqa: PLC0415
        retrieval_index.dense_search(index, q, [Exclusion(e[2][0]) for e in elems], 16, 16)
    else:
        s = sharded.ShardedSearch(out, ranges, k=2, num_candidates=16, nprobe=16)
        with beam.Pipeline(options=PipelineOptions(flags=[], runner="FnApiRunner")) as p:
            _ = sharded.search_queries(p | beam.Create(elems), s) | beam.combiners.Count.Globally()
    return {"search_s": round(time.perf_counter() - t, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


DB_SHARD = 250_000
DB_CHUNK = 32


def write_db(n: int, out: str) -> dict:
    """A synthetic chunk database of n rows (documents of 1-8 chunks) in DB_SHARD-row Parquet shards."""
    from pipeline.retrieval import store  # noqa: PLC0415

    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    doc_ids = np.repeat(np.arange(n), rng.integers(1, 9, n))[:n]
    shards = []
    for k, a in enumerate(range(0, n, DB_SHARD)):
        b = min(n, a + DB_SHARD)
        d = doc_ids[a:b]
        starts = np.r_[0, np.flatnonzero(d[1:] != d[:-1]) + 1]
        chunk_index = np.arange(b - a) - np.repeat(starts, np.diff(np.r_[starts, b - a]))
        rows = {"doc_id": d, "chunk_index": chunk_index, "source": ["s"] * (b - a),
                "tokens": list(rng.integers(0, 32000, (b - a, DB_CHUNK), dtype=np.int32)),
                "token_hash": rng.integers(0, 1 << 62, b - a)}
        path = f"chunks-{k:05d}.parquet"
        store.write_parquet(os.path.join(out, path), rows)
        shards.append({"path": path, "first_id": a, "chunks": b - a})
    with open(os.path.join(out, "db.json"), "w") as f:
        json.dump({"shards": shards, "chunk_len": DB_CHUNK}, f)
    return {"db_bytes": sum(os.path.getsize(os.path.join(out, s["path"])) for s in shards)}


def db_workers(out: str, whole: bool) -> dict:
    from types import SimpleNamespace  # noqa: PLC0415

    from pipeline.retrieval import db_rows, store  # noqa: PLC0415
    from transforms.retrieval.retrieval_chunks import QueryChunk  # noqa: PLC0415

    with open(os.path.join(out, "db.json")) as f:
        d = json.load(f)
    manifest = SimpleNamespace(shards=tuple(SimpleNamespace(**s) for s in d["shards"]), chunk_len=d["chunk_len"])
    n = sum(s["chunks"] for s in d["shards"])
    rng = np.random.default_rng(1)
    chunks = [QueryChunk(i, rng.integers(0, 32000, DB_CHUNK), (int(x),))
              for i, x in enumerate(rng.integers(0, n // 4, 2000))]
    rows = rng.integers(0, n, 4000)
    t = time.perf_counter()
    if whole:
        db = store.ChunkDatabase.from_manifest(out, manifest)
        excl = [(db.doc_range(c.doc_ids[0]), db.ids_with_hash(1)) for c in chunks]
        got = [db.with_continuation(int(r), 2 * DB_CHUNK, 0) for r in rows]
    else:
        excl = db_rows.exclusions(out, manifest, chunks)
        part = db_rows.NeededRows(out, manifest, rows, 3)
        got = [part.with_continuation(int(r), 2 * DB_CHUNK, 0) for r in rows]
    assert len(excl) == len(chunks) and len(got) == len(rows)
    return {"s": round(time.perf_counter() - t, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def db_main(args) -> int:
    rows = []
    for scale in (1, 4):
        d = os.path.join(args.dir, f"db-x{scale}")
        w = child(["--mode", "dbwrite", "--n", str(scale * args.db_base), "--dir", d])
        r = child(["--mode", "dbrows", "--dir", d])
        h = child(["--mode", "dbwhole", "--dir", d])
        rows.append({"scale": scale, "chunks": scale * args.db_base, **w, "by_row_group_peak_rss_mb": r["peak_rss_mb"],
                     "by_row_group_s": r["s"], "whole_peak_rss_mb": h["peak_rss_mb"], "whole_s": h["s"]})
        print(json.dumps(rows[-1]), flush=True)
    print(f"query/writer workers by row group 4x/1x peak RSS: "
          f"{rows[1]['by_row_group_peak_rss_mb'] / rows[0]['by_row_group_peak_rss_mb']:.2f}; "
          f"database loaded whole 4x/1x: {rows[1]['whole_peak_rss_mb'] / rows[0]['whole_peak_rss_mb']:.2f}")
    return 0


def child(argv) -> dict:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), *argv], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--nlist", type=int, default=1024)
    p.add_argument("--dir", default="out/bench/memory")
    p.add_argument("--mode", choices=["main", "build", "search", "whole", "dbwrite", "dbrows", "dbwhole"],
                   default="main")
    p.add_argument("--db-rows", action="store_true", help="measure the query and sidecar-writer workers instead")
    p.add_argument("--db-base", type=int, default=500_000)
    p.add_argument("--n", type=int, default=0)
    p.add_argument("--ranges", type=int, default=1)
    args = p.parse_args(argv)
    if args.mode == "dbwrite":
        print(json.dumps(write_db(args.n, args.dir)))
        return 0
    if args.mode in ("dbrows", "dbwhole"):
        print(json.dumps(db_workers(args.dir, args.mode == "dbwhole")))
        return 0
    if args.db_rows:
        return db_main(args)
    if args.mode == "build":
        print(json.dumps(build(args.n, args.dim, args.ranges, args.dir, args.nlist)))
        return 0
    if args.mode in ("search", "whole"):
        print(json.dumps(search(args.dir, args.ranges, args.queries, args.dim, args.mode == "whole")))
        return 0
    rows = []
    for scale in (1, 4):
        d = os.path.join(args.dir, f"x{scale}")
        common = ["--dim", str(args.dim), "--dir", d, "--ranges", str(scale), "--queries", str(args.queries)]
        b = child(["--mode", "build", "--n", str(scale * args.base), "--nlist", str(args.nlist), *common])
        s = child(["--mode", "search", *common])
        w = child(["--mode", "whole", *common])
        rows.append({"scale": scale, "chunks": scale * args.base, "ranges": scale, **b,
                     "sharded_peak_rss_mb": s["peak_rss_mb"], "sharded_search_s": s["search_s"],
                     "whole_peak_rss_mb": w["peak_rss_mb"]})
        print(json.dumps(rows[-1]), flush=True)
    print(f"{'scale':>5s} | {'chunks':>10s} | {'ranges':>6s} | {'index MB':>8s} | {'sharded peak RSS MB':>19s} | "
          f"{'whole-index peak RSS MB':>23s}")
    for r in rows:
        print(f"{r['scale']:5d} | {r['chunks']:10,d} | {r['ranges']:6d} | {r['index_bytes'] / 1e6:8.1f} | "
              f"{r['sharded_peak_rss_mb']:19.1f} | {r['whole_peak_rss_mb']:23.1f}")
    print(f"sharded 4x/1x peak RSS: {rows[1]['sharded_peak_rss_mb'] / rows[0]['sharded_peak_rss_mb']:.2f}; "
          f"whole index 4x/1x: {rows[1]['whole_peak_rss_mb'] / rows[0]['whole_peak_rss_mb']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
