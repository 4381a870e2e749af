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

    nice -n 10 python bench/retrieval_memory_bench.py --build [--build-mb 4]

`retrieval build` (BM25): a shard dataset of seeded random-word documents (--build-mb MB of text, the
unigram-1k-test tokenizer) and one of 4x the text, with 4x the dataset shards and database shards at 4x
(so one shard stays the same size). The build runs on FnApiRunner with one SDK worker in its own process
(`--direct_running_mode=multi_processing`): that worker's peak RSS (ru_maxrss of the reaped children) is the
largest worker's; the runner's own process, which also holds the shuffles between stages (a shuffle service's
job on a cluster), is reported apart. A third process per scale builds the BM25 postings alone from the written
database (what build_index.build_bm25 does in one worker). `--dense` runs the dense path instead (embeddings,
trained IVF64,SQ8 on 20,000 vectors, one filled part per database shard) with a hash of each chunk text standing
in for MiniLM, which would take hours on CPU.
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


# the shared test tokenizer, where tests/conftest.py finds shared data
TOKENIZER = os.path.join(os.environ.get("PILEPREP_SHARED_DATA") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "shared", "data"),
    "tokenizers", "unigram-1k-test.model")


def write_dataset(mb: float, shards: int, out: str) -> dict:
    """`mb` MB of the good corpus sharded at 128 tokens into `shards` train shards (the e2e tests' dataset)."""
    import pathlib  # noqa: PLC0415

    from pipeline.config import ShardConfig  # noqa: PLC0415
    from pipeline.shard import shard_pipeline  # noqa: PLC0415
    from tests.corpus_fixtures import pile_line, write_zst  # noqa: PLC0415

    t = time.perf_counter()
    corpus = pathlib.Path(out) / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    # seeded random-word documents of 2-6 KB (the test corpus's stdlib text runs out below 16 MB); this measures
    # memory only
    rng = np.random.default_rng(0)
    words = ["".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(2, 9))) for _ in range(20_000)]
    for f in range(shards):
        lines, size = [], 0
        while size < mb * 1e6 / shards:
            text = " ".join(words[i] for i in rng.zipf(1.2, rng.integers(400, 1200)) % len(words))
            lines.append(pile_line(text, f"src{len(lines) % 3}"))
            size += len(text)
        write_zst(corpus / f"{f:02d}.jsonl.zst", lines)
    tok = os.environ.get("PILEPREP_BENCH_TOKENIZER", TOKENIZER)
    if not os.path.exists(tok):
        raise SystemExit(f"no tokenizer at {tok}: set PILEPREP_BENCH_TOKENIZER")
    shard_pipeline.run(ShardConfig(inputs=(str(corpus / "*"),), output=os.path.join(out, "ds"), tokenizer=tok,
                                   seq_len=128, num_shards=shards, val_fraction=0.0, test_fraction=0.0,
                                   unit_mb=0.5), ["--runner=FnApiRunner", "--direct_num_workers=1",
                                                  "--direct_running_mode=in_memory"])
    return {"dataset_s": round(time.perf_counter() - t, 1)}


def hash_handler():
    """A stand-in for MiniLMHandler (pipeline/retrieval/build_index.py): seeded unit vectors of MiniLM's width from
    a hash of each chunk text, so the dense build's other steps (embeddings, train, fill) run at CPU speed. Memory
    only: these vectors mean nothing."""
    import hashlib  # noqa: PLC0415

    from apache_beam.ml.inference.base import ModelHandler, PredictionResult  # noqa: PLC0415

    from transforms.retrieval import retrieval_encoders  # noqa: PLC0415

    class HashHandler(ModelHandler):
        def load_model(self):
            return None

        def run_inference(self, batch, model, inference_args=None):
            out = []
            for x in batch:
                seed = int.from_bytes(hashlib.sha256(x.encode()).digest()[:8], "little")
                v = np.random.default_rng(seed).standard_normal(retrieval_encoders.MINILM_DIM).astype(np.float32)
                out.append(PredictionResult(x, v / np.linalg.norm(v)))
            return out

        def batch_elements_kwargs(self):
            return {"min_batch_size": 1, "max_batch_size": 64}

    return HashHandler


def build_db(out: str, db_shards: int, dense: bool) -> dict:
    """`retrieval build` (BM25, or dense with hash vectors and IVF64,SQ8 trained on 20,000 vectors) with one SDK
    worker process; the largest worker's and the runner's peak RSS."""
    from pipeline.retrieval import build as retrieval_build  # noqa: PLC0415
    from pipeline.retrieval.config import BuildConfig  # noqa: PLC0415

    t = time.perf_counter()
    extra = {}
    if dense:
        handler = hash_handler()
        retrieval_build.MiniLMHandler = lambda *a: handler()
        extra = {"encoder": "minilm", "index": "IVF64,SQ8", "train_size": 20_000}
    config = BuildConfig(dataset=os.path.join(out, "ds"), output=os.path.join(out, "db"), num_db_shards=db_shards,
                         **extra)
    m = retrieval_build.run(config, ["--runner=FnApiRunner", "--direct_num_workers=1",
                                     "--direct_running_mode=multi_processing"])
    return {"build_s": round(time.perf_counter() - t, 1), "chunks": int(m["counts"]["chunks"]),
            "worker_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
            "runner_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def bm25_only(out: str) -> dict:
    """The build's BM25 step alone (build_index.build_bm25: every database shard's tokens, then the postings)."""
    import glob  # noqa: PLC0415

    from pipeline.retrieval import store  # noqa: PLC0415
    from transforms.retrieval import retrieval_encoders  # noqa: PLC0415

    t = time.perf_counter()
    tokens = []
    for path in sorted(glob.glob(os.path.join(out, "db", "gen-*", "chunks-*.parquet"))):
        tokens += store.read_parquet(path, ["tokens"])["tokens"]
    retrieval_encoders.BM25Scorer.build(tokens).arrays()
    return {"bm25_s": round(time.perf_counter() - t, 1),
            "bm25_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def build_main(args) -> int:
    rows = []
    for scale in (1, 4):
        d = os.path.join(args.dir, f"build-x{scale}")
        w = child(["--mode", "dswrite", "--n", str(2 * scale), "--build-mb", str(scale * args.build_mb), "--dir", d])
        b = child(["--mode", "dbbuild", "--n", str(2 * scale), "--dir", d, *(["--dense"] if args.dense else [])])
        m = {} if args.dense else child(["--mode", "bm25only", "--dir", d])
        rows.append({"scale": scale, "text_mb": scale * args.build_mb, "shards": 2 * scale, **w, **b, **m})
        print(json.dumps(rows[-1]), flush=True)
    print(f"retrieval build largest worker 4x/1x peak RSS: "
          f"{rows[1]['worker_peak_rss_mb'] / rows[0]['worker_peak_rss_mb']:.2f}; "
          f"runner process 4x/1x: {rows[1]['runner_peak_rss_mb'] / rows[0]['runner_peak_rss_mb']:.2f}")
    if not args.dense:
        print(f"BM25 step alone (one process) 4x/1x: {rows[1]['bm25_peak_rss_mb'] / rows[0]['bm25_peak_rss_mb']:.2f}")
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
    p.add_argument("--mode", choices=["main", "build", "search", "whole", "dbwrite", "dbrows", "dbwhole",
                                         "dswrite", "dbbuild", "bm25only"],
                   default="main")
    p.add_argument("--db-rows", action="store_true", help="measure the query and sidecar-writer workers instead")
    p.add_argument("--db-base", type=int, default=500_000)
    p.add_argument("--build", action="store_true", help="measure `retrieval build` (BM25) instead")
    p.add_argument("--build-mb", type=float, default=4.0)
    p.add_argument("--dense", action="store_true", help="--build: the dense path with hash vectors, not BM25")
    p.add_argument("--n", type=int, default=0)
    p.add_argument("--ranges", type=int, default=1)
    args = p.parse_args(argv)
    if args.mode == "dbwrite":
        print(json.dumps(write_db(args.n, args.dir)))
        return 0
    if args.mode in ("dbrows", "dbwhole"):
        print(json.dumps(db_workers(args.dir, args.mode == "dbwhole")))
        return 0
    if args.mode == "dswrite":
        print(json.dumps(write_dataset(args.build_mb, args.n, args.dir)))
        return 0
    if args.mode == "dbbuild":
        print(json.dumps(build_db(args.dir, args.n, args.dense)))
        return 0
    if args.mode == "bm25only":
        print(json.dumps(bm25_only(args.dir)))
        return 0
    if args.build:
        return build_main(args)
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
