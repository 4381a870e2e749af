"""Retrieval benchmark: MiniLM chunks encoded/s, index build time and bytes/vector, queries/s, and recall@2 of
each index against exact search on held-out queries, all with same-document exclusion.

    python bench/retrieval_bench.py --dataset out/sample [--chunks 20000] [--queries 1000]
    python bench/retrieval_bench.py --vectors out/bench/minilm-<key>.npz --chunks 120000   # cached real vectors

A spec ending in `+rr<R>` (e.g. `OPQ48,IVF1024,PQ48np+rr64`) re-ranks the compressed index's top R candidates
exactly from an fp16 copy of the vectors on disk (memory-mapped; transforms/retrieval/retrieval_rerank.py).
`resident B/vector` counts codes + ids (coarse quantizer and rotation apart); `disk B/vector` is the serialized
index plus, for re-ranked kinds, the fp16 vectors file. --vectors takes the .npz bench/retrieval_corpus.py writes
(MiniLM vectors of 64-token chunks, document ids), so no database has to be built for the index figures.

Chunks are the first --chunks rows (document order, so whole documents) of a chunk database built from the
dataset's shards (BM25 database from `make retrieval`, or built here in-process from the shards' provenance);
queries are a seeded sample of those chunks that the IVF training sample does not contain. Embeddings are
cached under out/retrieval/bench-cache so a rerun measures only the index side (pass --fresh to re-encode).
Figures are relative to exact search measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pipeline.retrieval import store  # noqa: E402
from transforms.retrieval import retrieval_encoders, retrieval_index, retrieval_rerank  # noqa: E402
from transforms.tokenize import tokenizer  # noqa: E402
from transforms.retrieval.retrieval_index import Exclusion, IndexConfig  # noqa: E402


def load_chunks(args):
    db = store.ChunkDatabase.load(args.db)
    n = min(args.chunks, len(db))
    return db, n


def encode(db, n, args, cache):
    if os.path.exists(cache) and not args.fresh:
        vecs = np.load(cache)
        if len(vecs) >= n:
            return vecs[:n], None
    model_file = json.load(open(os.path.join(args.dataset, "manifest.json")))["config"]["tokenizer"]
    sp = tokenizer.load_processor(tokenizer.read_model_bytes(model_file))
    texts = [sp.decode([int(t) for t in db.tokens[i]]) for i in range(n)]
    import torch

    torch.set_num_threads(args.threads)
    model = retrieval_encoders.load_minilm("cpu")
    if args.bf16:
        model = model.to(torch.bfloat16)
    retrieval_encoders.minilm_encode(model, texts[:64], args.batch_size)  # warm-up
    t = time.perf_counter()
    vecs = retrieval_encoders.minilm_encode(model, texts, args.batch_size)
    rate = n / (time.perf_counter() - t)
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    np.save(cache, vecs)
    return vecs, rate


def resident_bytes(index, n: int) -> float:
    """Codes + ids per vector held in memory (the coarse quantizer and rotation counted apart)."""
    import faiss  # noqa: PLC0415

    ivf = faiss.try_extract_index_ivf(index)
    if ivf is None:
        return float(index.d * 4)  # Flat: the float32 vectors, ids implicit
    return float(ivf.code_size + 8)


def doc_ranges(doc_ids: np.ndarray) -> dict:
    """doc id -> [lo, hi) rows (each document's chunks are contiguous)."""
    starts = np.flatnonzero(np.r_[True, doc_ids[1:] != doc_ids[:-1]])
    ends = np.r_[starts[1:], len(doc_ids)]
    return {int(doc_ids[a]): (int(a), int(b)) for a, b in zip(starts, ends)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="out/sample")
    p.add_argument("--db", default="out/retrieval/db-bm25", help="chunk database to take chunks from")
    p.add_argument("--chunks", type=int, default=20_000)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--nprobe", type=int, default=64)
    p.add_argument("--specs", nargs="+", default=None, help="index specs (default: Flat, IVF Flat/SQ8/PQ)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--bf16", action="store_true")
    p.add_argument("--fresh", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the figures here")
    p.add_argument("--vectors", default=None, help="cached .npz from bench/retrieval_corpus.py (no database)")
    p.add_argument("--no-bm25", action="store_true")
    p.add_argument("--fp16-db", action="store_true",
                   help="train and fill the index from the vectors rounded to fp16, as `retrieval build` stores them")
    args = p.parse_args(argv)

    if args.vectors:
        cached = np.load(args.vectors)
        n = min(args.chunks, len(cached["vectors"]))
        doc_ids = cached["doc_ids"][:n]
        n = int(np.flatnonzero(doc_ids != doc_ids[n - 1])[-1] + 1) if doc_ids[0] != doc_ids[n - 1] else n
        vecs, doc_ids, rate, db = np.asarray(cached["vectors"][:n], np.float32), doc_ids[:n], None, None
        ranges = doc_ranges(doc_ids)
        args.no_bm25 = True
    else:
        db, n = load_chunks(args)
        if n < args.chunks:
            print(f"note: the database has only {n} chunks (asked for {args.chunks})")
        cache = os.path.join("out", "retrieval", "bench-cache", f"minilm-{db.manifest.fingerprint}.npy")
        vecs, rate = encode(db, n, args, cache)
        doc_ids = db.doc_ids[:n]
        ranges = None
    nlist = 1 << max(4, int(round(np.log2(4 * np.sqrt(n)))))
    pq = retrieval_index.COMPRESSED_PQ
    specs = args.specs or ["Flat", f"IVF{nlist},Flat", f"IVF{nlist},SQ8", f"IVF{nlist},PQ48np",
                           f"IVF{nlist},PQ{pq}np+rr32", f"OPQ{pq},IVF{nlist},PQ{pq}np", f"OPQ{pq},IVF{nlist},PQ{pq}np+rr16",
                           f"OPQ{pq},IVF{nlist},PQ{pq}np+rr32", f"OPQ{pq},IVF{nlist},PQ{pq}np+rr64"]
    rng = np.random.default_rng(args.seed)
    train_ids = retrieval_index.training_sample(n, min(n, 50 * nlist), args.seed)
    pool = np.setdiff1d(np.arange(n), train_ids) if len(train_ids) < n else np.arange(n)
    q_rows = np.sort(rng.choice(pool, size=min(args.queries, len(pool)), replace=False))
    excl = []
    for r in q_rows:
        lo, hi = ranges[int(doc_ids[r])] if ranges is not None else db.doc_range(int(doc_ids[r]))
        excl.append(Exclusion(((lo, min(hi, n)),)))
    queries = vecs[q_rows]  # float32, as the query workers encode them; exact search on float32 too
    db_vecs = vecs.astype(np.float16).astype(np.float32) if args.fp16_db else vecs
    t = time.perf_counter()
    _, exact = retrieval_index.exact_search(vecs, queries, excl, args.k)
    exact_qps = len(q_rows) / (time.perf_counter() - t)
    own_top1 = np.mean(
        doc_ids[retrieval_index.exact_search(vecs, queries, [Exclusion()] * len(q_rows), 2)[1][:, 1]]
        == doc_ids[q_rows])
    rows = []
    out_extra = {}
    built = {}  # one build per factory string: the +rr<R> variants share it
    fp16_path = os.path.join("out", "bench", f"rerank-vectors-{n}.npy")
    fp16_bytes = 0
    for spec in specs:
        factory, _, rr = spec.partition("+rr")
        rerank = int(rr or 0)
        cfg = IndexConfig(factory, args.nprobe, len(train_ids), args.seed, rerank)
        t = time.perf_counter()
        if factory not in built:
            trained = retrieval_index.serialize(retrieval_index.train_index(vecs.shape[1], cfg, db_vecs[train_ids]))
            bounds = np.linspace(0, n, 5).astype(int)
            parts = [retrieval_index.serialize(retrieval_index.fill_part(trained, db_vecs[a:b], int(a)))
                     for a, b in zip(bounds, bounds[1:])]
            index = retrieval_index.merge_parts(trained, parts)
            built[factory] = (index, time.perf_counter() - t, len(retrieval_index.serialize(index)))
        index, build_s, nbytes = built[factory]
        disk = nbytes
        if rerank:
            if not fp16_bytes:
                t = time.perf_counter()
                os.makedirs(os.path.dirname(fp16_path), exist_ok=True)
                fp16_bytes = retrieval_rerank.write_fp16(fp16_path, vecs)
                built["fp16_s"] = time.perf_counter() - t
            build_s += built["fp16_s"]
            disk += fp16_bytes
            searcher = retrieval_rerank.RerankedIndex(
                index, retrieval_rerank.row_reader(retrieval_rerank.open_rows(fp16_path)), rerank)
        t = time.perf_counter()
        if rerank:
            _, got = searcher.search(queries, excl, args.k, args.nprobe)
        else:
            _, got = retrieval_index.dense_search(index, queries, excl, args.k, args.nprobe)
        qps = len(q_rows) / (time.perf_counter() - t)
        recall = float(np.mean([len(set(g) & set(x)) / args.k for g, x in zip(got, exact)]))
        leaked = int(sum(e.contains(g[g >= 0]).sum() for e, g in zip(excl, got)))
        rows.append({"index": spec, "build_s": round(build_s, 2),
                     "resident_bytes_per_vector": round(resident_bytes(index, n), 1),
                     "disk_bytes_per_vector": round(disk / n, 1),
                     "queries_per_s": round(qps, 1), f"recall@{args.k}": round(recall, 4), "excluded_leaks": leaked})
        print(rows[-1], flush=True)
        if rerank and "ranges_touched" not in out_extra:  # routing fan-out of the range-sharded search
            from transforms.retrieval import retrieval_ranges  # noqa: PLC0415

            out_extra["ranges_touched"] = {
                r: round(float(np.mean([len(t) for t in retrieval_ranges.probe_ranges(index, queries, args.nprobe, r)])),
                         2) for r in (4, 16, 64)}
    bm25_build = bm25_qps = float("nan")
    if not args.no_bm25:  # BM25 on the same chunks and queries, for the lexical baseline's speed
        t = time.perf_counter()
        bm25 = retrieval_encoders.BM25Scorer.build(db.tokens[:n])
        bm25_build = time.perf_counter() - t
        t = time.perf_counter()
        bm25.search([db.tokens[r] for r in q_rows], excl, args.k)
        bm25_qps = len(q_rows) / (time.perf_counter() - t)
    out = {"chunks": n, "queries": int(len(q_rows)), "dim": int(vecs.shape[1]),
           "minilm_chunks_per_s": None if rate is None else round(rate, 1), "minilm_threads": args.threads,
           "exact_queries_per_s": round(exact_qps, 1), "exact_top1_from_own_document": round(float(own_top1), 3),
           "indexes": rows, **out_extra, "bm25_build_s": round(bm25_build, 2), "bm25_queries_per_s": round(bm25_qps, 1)}
    print(f"{n:,} chunks, {len(q_rows):,} held-out queries, same-document exclusion; MiniLM "
          f"{out['minilm_chunks_per_s'] or '(cached)'} chunks/s on {args.threads} threads; exact search "
          f"{exact_qps:,.0f} q/s; exact top-1 (no exclusion) from the query's own document: {own_top1:.0%}")
    print(f"N chunks: {n}")
    print(f"{'index':32s} | {'build s':>8s} | {'resident B/vector':>17s} | {'disk B/vector':>13s} | {'queries/s':>9s} | "
          f"{'recall@' + str(args.k):>9s} | excluded ids returned")
    for r in rows:
        print(f"{r['index']:32s} | {r['build_s']:8.2f} | {r['resident_bytes_per_vector']:17.1f} | "
              f"{r['disk_bytes_per_vector']:13.1f} | {r['queries_per_s']:9.1f} | {r[f'recall@{args.k}']:9.4f} | "
              f"{r['excluded_leaks']}")
    if "ranges_touched" in out_extra:
        print(f"ranges a query's {args.nprobe} probes touch (of R): {out_extra['ranges_touched']}")
    print(f"BM25 (8 rarest query terms): build {bm25_build:.2f}s, {bm25_qps:,.0f} q/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
