"""`pileprep retrieval build | neighbours | show`: argument parsing and the text each prints (pipeline/cli.py
prints it)."""
from __future__ import annotations

import json

from pipeline.retrieval.config import BuildConfig, NeighboursConfig


def add_parsers(subcommand) -> None:
    """Define `retrieval build | neighbours | show`; `subcommand(name, help)` makes each parser (pipeline/cli.py)."""
    b = subcommand("build", "chunk database (+ embeddings + index) from a committed shard dataset")
    b.add_argument("--dataset", required=True, help="committed shard dataset (directory with manifest.json)")
    b.add_argument("--output", required=True, help="chunk database directory (local or s3://)")
    b.add_argument("--chunk-len", type=int, default=64)
    b.add_argument("--splits", nargs="+", default=["train"], help="dataset splits that go into the database")
    b.add_argument("--encoder", default="bm25", help="bm25 (lexical, no model) or minilm (all-MiniLM-L6-v2)")
    b.add_argument("--index", default="auto", help="Faiss spec for minilm: auto, Flat, IVF<n>,Flat, IVF<n>,SQ8, "
                                                   "IVF<n>,PQ<m>np")
    b.add_argument("--nprobe", type=int, default=64)
    b.add_argument("--rerank", type=int, default=0,
                   help="candidates per query re-ranked exactly from the fp16 embeddings, e.g. 32 with IVF<n>,PQ48np "
                        "(0: none, except auto's compressed index and OPQ, 64)")
    b.add_argument("--train-size", type=int, default=100_000, help="vectors in the seeded IVF training sample")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--num-db-shards", type=int, default=4)
    b.add_argument("--doc-fraction", type=float, default=1.0,
                   help="keep documents whose id falls in this fraction of the id space (a deterministic subset)")
    b.add_argument("--device", default="cpu", help="dense encoder device on workers (cuda on GPU workers)")
    b.add_argument("--batch-size", type=int, default=64, help="dense encoder batch (256-1024 on a GPU)")
    b.add_argument("--no-sources", dest="sources", action="store_false",
                   help="do not read the dataset's input files for each document's source")
    n = subcommand("neighbours", "top-k neighbours per training chunk, as a sidecar of a shard generation")
    n.add_argument("--dataset", required=True)
    n.add_argument("--db", required=True, help="chunk database built by `pileprep retrieval build`")
    n.add_argument("--output", required=True, help="sidecar directory")
    n.add_argument("--num-neighbours", type=int, default=2)
    n.add_argument("--neighbour-len", type=int, default=128, help="neighbour chunk + continuation tokens")
    n.add_argument("--nprobe", type=int, default=None, help="IVF lists probed (default: the database's)")
    n.add_argument("--ranges", type=int, default=0,
                   help="search an IVF index in this many ranges of inverted lists through the runner's "
                        "GroupByKey, no worker holding the whole index (0: each worker holds it; the sidecar "
                        "does not depend on the number)")
    n.add_argument("--device", default="cpu")
    n.add_argument("--batch-size", type=int, default=64)
    s = subcommand("show", "summary of a database + sidecar with a decoded chunk and its neighbours")
    s.add_argument("--dataset", required=True)
    s.add_argument("--db", required=True)
    s.add_argument("--neighbours", required=True, help="sidecar directory")
    s.add_argument("--example", type=int, default=0)
    s.add_argument("--chunk", type=int, default=None, help="chunk of the example (default: first with neighbours)")


def command_output(args, beam_args) -> str:
    """Run `retrieval build | neighbours | show`; returns what pipeline/cli.py prints (the only module that does)."""
    if args.retrieval_command == "build":
        from pipeline.retrieval import build  # noqa: PLC0415

        cfg = BuildConfig(dataset=args.dataset, output=args.output, chunk_len=args.chunk_len,
                          splits=tuple(args.splits), encoder=args.encoder, index=args.index, nprobe=args.nprobe,
                          train_size=args.train_size, seed=args.seed, num_db_shards=args.num_db_shards,
                          doc_fraction=args.doc_fraction, device=args.device, batch_size=args.batch_size,
                          sources=args.sources, rerank=args.rerank)
        m = build.run_outcome(cfg, beam_args).manifest
        return json.dumps({"generation": m["generation"], "counts": m["counts"], "encoder": m["encoder"]["name"],
                           "index": m["index"].get("config", {"kind": m["index"]["kind"]}),
                           "sources": m["sources"]}, indent=1, sort_keys=True)
    if args.retrieval_command == "neighbours":
        from pipeline.retrieval import neighbours  # noqa: PLC0415

        cfg = NeighboursConfig(dataset=args.dataset, db=args.db, output=args.output,
                               num_neighbours=args.num_neighbours, neighbour_len=args.neighbour_len,
                               batch_size=args.batch_size, device=args.device, nprobe=args.nprobe,
                               ranges=args.ranges)
        m = neighbours.run_outcome(cfg, beam_args).manifest
        r = m["retrieval"]
        return json.dumps({"generation": m["generation"], "fingerprint": r["fingerprint"], "counts": r["counts"],
                           "storage": r["storage"]}, indent=1, sort_keys=True)
    from pipeline.retrieval.show import show  # noqa: PLC0415

    return show(args.dataset, args.db, args.neighbours, args.example, args.chunk)
