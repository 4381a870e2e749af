"""pileprep against Megatron-LM's own preprocessing on the same documents, in one run.

    python bench/megatron_side_by_side.py --megatron-dir DIR [--megatron-fast-dir FAST_DIR] [--sizes 96 384 16x96]
                                          [--backends sentencepiece auto] [--repeat N] [--checkouts PILEPREP_DIR ...]

DIR is a checkout of Megatron-LM (the figures in docs/BENCHMARKS.md used tag core_v0.16.1:
`git clone --branch core_v0.16.1 https://github.com/NVIDIA/Megatron-LM`), run with this Python. For each corpus
size (built by `pileprep sample --size-mb N`, cached like bench/shard_bench.py's):

1. raw single-thread `sp.encode` of every document (bench/shard_bench.py's RawReference: the CPU floor);
2. Megatron's `tools/preprocess_data.py --workers W --append-eod --tokenizer-type Llama2Tokenizer`, unchanged,
   on one `.jsonl` holding the same documents. It cannot read `.jsonl.zst`; the plain file is written before
   the clock starts, so Megatron is spared the decompression pileprep pays;
3. with `--megatron-fast-dir FAST_DIR` (or $MEGATRON_FAST_DIR: Megatron-LM's main at d98e8a64 or later),
   issue 30's measuring stick: its fast script with `--use-gigatoken` on the same plain `.jsonl`, with Llama 2 as
   the HF tokenizer dir bench/megatron_tokenizer.py builds (`--check-tokenizer` first compares its tokens with
   `sp.encode` on every document); bench/megatron_fast.py runs it and prints the pileprep ÷ fast tables (wall,
   CPU, peak RSS, marginal CPU per token between sizes) and issue 30's targets;
4. `pileprep shard` with each backend, on the `.jsonl.zst` corpus, with the default runner, W workers
   (bench/shard_bench.py's run_pipeline: the same command `make bench` times).

A size `KxN` is K distinct copies of the N MB sample (bench/megatron_corpus.py; issue 30's 1.5 GB is `16x96`);
its raw SentencePiece rate is measured on the N MB sample.

`--checkouts A B` times pileprep from each checkout (PYTHONPATH and working directory = the checkout, this
Python) in the same alternation, each labelled with its commit: issue 29's before/after speed rule (384 MB wall
within 5%, tokens per CPU-second not lower). Without --megatron-dir (and $MEGATRON_DIR) Megatron's classic
script is left out, without --megatron-fast-dir (and $MEGATRON_FAST_DIR) its fast one.

Every tool runs in a fresh process; wall is start to exit; peak RSS is the largest single process (wait4's
ru_maxrss over the process and every child it reaped) and the sampled process tree. Ratios as in
bench/shard_bench.py: raw single-thread seconds ÷ (W × wall). The run order alternates per size and per
repeat (A B, B A, ...) so that a slow stretch of a shared VM does not always fall on the same tool; with
`--repeat N` every tool runs N times per size and the table holds each tool's median run by wall (the lower
middle one for an even N; use an odd N).

Megatron's `megatron.training` package imports a Triton GPU kernel module at import time (batch-invariant
matmuls) that preprocessing never calls; without Triton installed (a CPU machine) that import fails, so the
entry script `_megatron_entry.py` puts a stand-in for that one module in place before running Megatron's script
with runpy (and, on Python 3.11, `typing.override` for the newer checkout). Nothing else of Megatron is touched.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shard_bench import (REPO, SHARED_TOKENIZER, RawReference, _installation_fingerprint, build_corpus,  # noqa: E402
                         iter_texts, run_pipeline)
from megatron_corpus import build_copies_corpus  # noqa: E402
from megatron_fast import (FAST, fast_script, hf_tokenizer, print_fast_tables, run_megatron_fast,  # noqa: E402
                           run_megatron_script)


def write_plain_jsonl(root: str, path: str) -> int:
    """Every document of the corpus (train, val, test: what pileprep shards) as one plain jsonl for Megatron, once."""
    if os.path.exists(path):
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    n = 0
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for text in iter_texts(root):
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
            n += 1
    os.replace(path + ".tmp", path)
    return n


def run_megatron(megatron_dir: str, jsonl: str, tokenizer: str, out_dir: str, workers: int) -> dict:
    return run_megatron_script(megatron_dir, [os.path.join(megatron_dir, "tools", "preprocess_data.py"), "--input",
                                              jsonl, "--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model",
                                              tokenizer, "--workers", str(workers), "--append-eod"], out_dir)


def _commit(checkout: str) -> str:
    """A checkout's short commit (+dirty when tracked files differ from it), to label its runs."""
    def git(*a):
        return subprocess.run(["git", "-C", checkout, *a], capture_output=True, text=True, check=False).stdout
    head = git("rev-parse", "--short", "HEAD").strip() or os.path.basename(checkout)
    return head + ("+dirty" if git("status", "--short", "--untracked-files=no").strip() else "")


def size_parts(size: str) -> tuple:
    """("K", "N") of a --sizes entry ("" for K when it is a plain N), or exit naming it: checked for every entry
    before the first corpus is built, so a typo in the last one does not cost the runs of the others."""
    copies, sep, base = size.lower().rpartition("x")
    if not base.isdigit() or (sep and not copies.isdigit()) or int(base) == 0 or (sep and int(copies) == 0):
        raise SystemExit(f"--sizes {size}: give N (MB) or KxN (K copies of the N MB sample), K and N at least 1")
    return copies, base


def corpus_for(cache_dir: str, size: str, fingerprint: str) -> tuple:
    """(label, corpus root, root the raw reference reads) of one --sizes entry: "N" is `pileprep sample
    --size-mb N`; "KxN" is K distinct copies of that sample (bench/megatron_corpus.py), whose raw SentencePiece
    rate is measured on the N MB base (the same documents but for one marker line: two single-thread passes
    over 1.5 GB would take ~15 minutes)."""
    copies, base = size_parts(size)
    if not copies:
        root = build_corpus(cache_dir, int(base), fingerprint, rebuild=False)["output_dir"]
        return f"{base} MB", root, root
    summary = build_copies_corpus(cache_dir, int(copies), int(base), fingerprint)
    return f"{int(copies) * int(base)} MB ({copies}×{base})", summary["output_dir"], summary["base"]


def _load() -> str:
    """The 1-minute load average: on a shared machine the figures mean little without it."""
    return f"{os.getloadavg()[0]:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--megatron-dir", default=os.environ.get("MEGATRON_DIR"),
                   help="a Megatron-LM checkout (default $MEGATRON_DIR; without either, Megatron is not run)")
    p.add_argument("--megatron-fast-dir", default=os.environ.get("MEGATRON_FAST_DIR"),
                   help="a Megatron-LM checkout at d98e8a64 or later, for tools/preprocess_data_fast.py "
                        "--use-gigatoken (default $MEGATRON_FAST_DIR; without either, it is not run)")
    p.add_argument("--hf-tokenizer", help="the HF tokenizer dir for the fast script (default: built from "
                                          "--tokenizer into CACHE_DIR/<model>-hf by bench/megatron_tokenizer.py)")
    p.add_argument("--check-tokenizer", action="store_true",
                   help="before timing, compare the fast script's tokens with sp.encode on every document of "
                        "each corpus (bench/megatron_tokenizer.py check; ~2 min per 100 MB on one core)")
    p.add_argument("--checkouts", nargs="+", default=[REPO], metavar="DIR",
                   help="pileprep checkouts to time, alternating (default: this one)")
    p.add_argument("--tokenizer", default=SHARED_TOKENIZER, help="SentencePiece BPE model (Llama 2's by default)")
    p.add_argument("--sizes", nargs="+", default=["96", "384"],
                   help="corpus sizes: N (MB, `pileprep sample --size-mb N`) or KxN (K distinct copies of the N MB "
                        "sample: issue 30's 1.5 GB is 16x96)")
    p.add_argument("--backends", nargs="+", default=["sentencepiece", "auto"])
    p.add_argument("--workers", type=int, default=2, help="Megatron's --workers; pileprep's default runner uses "
                                                          "one worker per core")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--cache-dir", default=os.path.join(REPO, "out", "bench"))
    p.add_argument("--repeat", type=int, default=1, help="runs of every tool per size, alternating; the table "
                                                         "holds each tool's median run by wall")
    args = p.parse_args(argv)
    for size in args.sizes:
        size_parts(size)
    script = args.megatron_dir and os.path.join(args.megatron_dir, "tools", "preprocess_data.py")
    if script and not os.path.exists(script):
        raise SystemExit(f"{script} not found: --megatron-dir must be a Megatron-LM checkout")
    if not os.path.exists(args.tokenizer):
        raise SystemExit(f"tokenizer {args.tokenizer} not found")
    fast = args.megatron_fast_dir and fast_script(args.megatron_fast_dir)
    hf_dir = args.hf_tokenizer or (fast and hf_tokenizer(args.tokenizer, os.path.join(
        args.cache_dir, os.path.splitext(os.path.basename(args.tokenizer))[0] + "-hf")))
    checkouts = {os.path.abspath(c): _commit(c) for c in args.checkouts}
    pileprep = [(c, b) for c in checkouts for b in args.backends]  # what runs besides Megatron, in order
    fingerprint = _installation_fingerprint()
    rows = []
    for i, size in enumerate(args.sizes):
        size, root, raw_root = corpus_for(args.cache_dir, size, fingerprint)
        jsonl = os.path.join(root, "megatron.jsonl")  # inside the corpus: a rebuilt corpus drops it too
        docs = write_plain_jsonl(root, jsonl)
        if fast and args.check_tokenizer:
            print(f"{size}: the fast script's tokens against sp.encode: "
                  f"{hf_tokenizer(args.tokenizer, hf_dir, jsonl)}", flush=True)
        raw = RawReference(args.tokenizer, raw_root)
        raw.measure()
        print(f"{size}: {docs:,} documents; raw SentencePiece {raw.rate / 1e6:.2f} M tokens/s/core (pass 1)",
              flush=True)
        runs: dict = {}
        for rep in range(max(1, args.repeat)):
            tools = (["megatron"] if script else []) + ([FAST] if fast else []) + pileprep
            if (i + rep) % 2:
                tools.reverse()
            for tool in tools:
                if tool == "megatron":
                    r = run_megatron(args.megatron_dir, jsonl, args.tokenizer,
                                     os.path.join(args.cache_dir, "run", "megatron"), args.workers)
                elif tool == FAST:
                    r = run_megatron_fast(args.megatron_fast_dir, jsonl, hf_dir,
                                          os.path.join(args.cache_dir, "run", FAST))
                else:
                    checkout, backend = tool
                    r = run_pipeline(root, args.tokenizer, os.path.join(args.cache_dir, "run", f"side-{backend}"),
                                     backend, args.seq_len, [], repo=checkout)
                    at = f" @{checkouts[checkout]}" if len(checkouts) > 1 else ""
                    r["label"] = f"pileprep {backend} ({r['backend_ran']}){at}"
                runs.setdefault(tool, []).append(r)
                print(f"  {r.get('label', tool)} (run {rep + 1}): {r['tokens']:,} tokens, wall {r['wall']:.1f}s, "
                      f"CPU {r['cpu_s']:.1f}s, peak RSS largest {r['largest_mb']:.0f} MB / tree {r['tree_mb']:.0f} MB; "
                      f"load {_load()}", flush=True)
        raw.measure()
        results = {tool: sorted(rs, key=lambda r: r["wall"])[(len(rs) - 1) // 2] for tool, rs in runs.items()}
        rows.append((size, docs, raw, results))
    versus = "Megatron's" if script else "the fast script's" if fast else "the first row's"
    print("\n## Megatron-LM preprocess_data.py vs pileprep shard, same documents, same machine, one invocation")
    print(f"{args.workers} workers; ratio = raw single-thread s ÷ ({args.workers} × wall); raw = best of 2 passes "
          f"(before / after the tools ran); each tool's median of {max(1, args.repeat)} run(s); CPU = user + system "
          f"of the process and its children; load average at the end {_load()}; this bench process's own peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB (the floor of every 'largest' "
          f"figure: Linux carries a parent's peak into a child's ru_maxrss)\n")
    print(f"| corpus | tool | tokens | wall s | CPU s | tokens / CPU-s | ratio | wall ÷ {versus} "
          f"| peak RSS largest / tree MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size, docs, raw, results in rows:
        ordered = [results[t] for t in ["megatron", FAST, *pileprep] if t in results]
        for r in ordered:
            raw_s = r["tokens"] / raw.rate
            print(f"| {size}, {docs:,} docs | {r.get('label', 'megatron')} | {r['tokens'] / 1e6:.1f} M "
                  f"| {r['wall']:.1f} | {r['cpu_s']:.1f} | {r['tokens'] / r['cpu_s'] / 1e3:.0f} k "
                  f"| {raw_s / (args.workers * r['wall']):.2f} | {r['wall'] / ordered[0]['wall']:.2f} "
                  f"| {r['largest_mb']:.0f} / {r['tree_mb']:.0f} |")
    print("\n(Megatron reads plain .jsonl, written before its clock starts; pileprep reads and decompresses the "
          ".jsonl.zst corpus, splits train/val/test, dedups, packs and writes TFRecord shards with a manifest)")
    print_fast_tables(rows, pileprep, lambda tool, r: r.get("label", tool))
    return 0


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.exit(main())
