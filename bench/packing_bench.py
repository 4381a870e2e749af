"""Concat vs best-fit packing on a bench corpus: `pileprep shard --packing concat|best-fit`, each in a fresh
process (wall, CPU, peak RSS), then the shards read back to count what each packing did to the documents.

The counts come from the shards' provenance, not from the manifest (a concat manifest has no packing section):
per split, the documents (first pieces), those split over more than one example, those that fit in one example
(EOS included) and of them the ones split anyway, examples per document, and the padding fraction.

  python bench/packing_bench.py [--size-mb 384] [--seq-len 2048] [--tokenizer PATH] [--window N] [--json OUT]
  python bench/packing_bench.py --real-sample [--seq-len 2048]   (../shared/data's real files instead)

The corpus is bench/shard_bench.py's (`pileprep sample --size-mb N`, cached in out/bench/); the tokenizer the
Llama 2 model from ../shared/data when present.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.shard_bench import (REPO, SAMPLE_TOKENIZER, _env, _installation_fingerprint, build_corpus,  # noqa: E402
                               run_measured, shard_args)
from model_contract import decode_example, read_records  # noqa: E402

LLAMA = os.path.join(REPO, "..", "shared", "data", "tokenizers", "llama2-bpe-32k.model")
SHARED = os.path.join(REPO, "..", "shared", "data")


def real_sample_args(tokenizer: str, out: str, seq_len: int) -> list:
    """`pileprep shard` over ../shared/data's real files: the Pile sample and the other corpora as train input,
    the Pile's val and test files whole (as the 384 MB bench corpus is laid out)."""
    import glob  # noqa: PLC0415

    train = [os.path.join(SHARED, "pile", "00.jsonl.zst")] + sorted(glob.glob(os.path.join(SHARED, "other", "*")))
    return [sys.executable, "-m", "pipeline.cli", "shard", "--input", *train,
            "--val-input", os.path.join(SHARED, "pile", "val.jsonl.zst"),
            "--test-input", os.path.join(SHARED, "pile", "test.jsonl.zst"), "--output", out,
            "--tokenizer", tokenizer, "--seq-len", str(seq_len), "--tokenizer-backend", "auto",
            "--progress-every", "0"]


def shard_stats(out: str, seq_len: int) -> dict:
    """Per split: documents, split, fitting, fitting_split, examples per document, padding fraction."""
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    result = {}
    for split in manifest["splits"]:
        pieces: dict = collections.Counter()
        lengths: dict = collections.Counter()
        examples = padding = 0
        for s in manifest["shards"]:
            if s["split"] != split:
                continue
            for record in read_records(os.path.join(out, s["path"])):
                ex = decode_example(record)
                examples += 1
                seg = ex["segment_ids"]
                padding += int((seg == 0).sum())
                counts = np.bincount(seg, minlength=ex["piece_doc_ids"].size + 1)[1:]
                for doc, n in zip(ex["piece_doc_ids"].tolist(), counts.tolist()):
                    pieces[doc] += 1
                    lengths[doc] += n
        docs = len(pieces)
        split_docs = sum(1 for p in pieces.values() if p > 1)
        fitting = [d for d, n in lengths.items() if n <= seq_len]
        fitting_split = sum(1 for d in fitting if pieces[d] > 1)
        result[split] = {"documents": docs, "split": split_docs, "split_share": split_docs / max(docs, 1),
                         "fitting": len(fitting), "fitting_split": fitting_split,
                         "fitting_split_share": fitting_split / max(len(fitting), 1),
                         "examples": examples, "examples_per_document": sum(pieces.values()) / max(docs, 1),
                         "padding_fraction": padding / max(examples * seq_len, 1)}
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size-mb", type=int, default=384)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--tokenizer", default=LLAMA if os.path.exists(LLAMA) else SAMPLE_TOKENIZER)
    p.add_argument("--window", type=int, default=None, help="--packing-window (default: the option's)")
    p.add_argument("--cache-dir", default=os.path.join(REPO, "out", "bench"))
    p.add_argument("--json", default=None, help="write the figures here too")
    p.add_argument("--real-sample", action="store_true", help="../shared/data's real files, not the bench corpus")
    args = p.parse_args(argv)
    root = None
    if not args.real_sample:
        root = build_corpus(args.cache_dir, args.size_mb, _installation_fingerprint(), False)["output_dir"]
    name = "real-sample" if args.real_sample else f"{args.size_mb}mb"
    figures = {"corpus": name, "seq_len": args.seq_len, "tokenizer": os.path.basename(args.tokenizer)}
    for packing in ("concat", "best-fit"):
        out = os.path.join(args.cache_dir, f"packing-{packing}-{name}-{args.seq_len}")
        window = ["--packing-window", str(args.window)] if args.window and packing == "best-fit" else []
        extra = ["--packing", packing] + window  # --packing-window without best-fit is exit 2 (pipeline/config.py)
        base = (real_sample_args(args.tokenizer, out, args.seq_len) if args.real_sample
                else shard_args(root, args.tokenizer, out, "auto", args.seq_len, []))
        cmd = base + extra + ["--overwrite"]
        with open(out + ".stdout", "w") as so, open(out + ".stderr", "w") as se:
            run = run_measured(cmd, _env(), REPO, so, se)
        if run["returncode"] != 0:
            raise SystemExit(f"pileprep shard --packing {packing} failed: see {out}.stderr")
        figures[packing] = {"wall_s": round(run["wall"], 1), "cpu_s": round(run["cpu_s"], 1),
                            "largest_mb": round(run["largest_mb"]), "splits": shard_stats(out, args.seq_len)}
    print(json.dumps(figures, indent=1, sort_keys=True))
    c, b = figures["concat"]["splits"]["train"], figures["best-fit"]["splits"]["train"]
    print(f"train: fitting documents split concat {c['fitting_split']} / best-fit {b['fitting_split']}; padding "
          f"concat {100 * c['padding_fraction']:.3f}% / best-fit {100 * b['padding_fraction']:.3f}%; wall "
          f"{figures['concat']['wall_s']} s / {figures['best-fit']['wall_s']} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
