"""What routing by construction costs the default `pileprep shard` path: two (or more) repository trees, alternating.

    python bench/routing_cost_bench.py --trees BEFORE AFTER [MORE...] [--labels before after ...] [--runs 3]
        [--corpus out/bench/corpus-384mb] [--tokenizer ../shared/data/tokenizers/llama2-bpe-32k.model]
        [--shard-args '...'] [--split]

Each tree is a checkout of pileprep (a git worktree: `git worktree add --detach DIR COMMIT`) with its own `.venv`
(or a link to one) and its C extensions built. Every run is `pileprep shard` with the default options (auto
backend, default unit and shard sizes; `--shard-args` adds to them) on the same corpus (bench/shard_bench.py's
`pileprep sample --size-mb 384`, cached in out/bench/), in a fresh process with its tree's Python and
PYTHONPATH, into a fresh output folder. Rounds alternate the order (A B, B A, A B, ...: A B B A A B for 3 runs of
2 trees), so a slow stretch of a shared machine does not always fall on one tree.

Before the timed rounds each tree runs once with an empty tokenizer cache ($PILEPREP_TOKENIZER_CACHE, one folder
per tree under --out-dir): that first run pays the one-off derivations (the gigatoken tokenizer.json, and after
the routing change the domain), reported on its own line; the timed runs reuse that tree's cache, as every run
after the first on a machine does.

Per run: wall (start to exit), CPU seconds of the whole process tree (user + system: this process is the
subreaper of the run's descendants and reaps them all, so RUSAGE_CHILDREN counts a worker even if the CLI never
reaped it; the CLI's own wait4 figure is printed beside it), tokens (manifest), tokens per CPU-second, peak RSS (largest process / sampled tree), the
load average before the run, and the manifest's documents and bytes per backend (how many the routing sent to the
reference). The summary gives each tree's median and spread and the ratios to the first tree: of the medians
and, the steadier one on a shared machine, the median of the per-round ratios (each round runs the trees back to
back).

`--split` (run from a tree that routes) times the routing's parts in this process on every document of the
corpus: `Router.admits`, gigatoken's encode of all documents (what the run did before) and of the admitted ones,
and the reference's encode of the ones sent to it.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shlex
import shutil
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shard_bench import REPO, SHARED_TOKENIZER, corpus_files, iter_texts, run_measured  # noqa: E402

DEFAULT_CORPUS = os.path.join(REPO, "out", "bench", "corpus-384mb")


def shard_command(tree: str, corpus: str, tokenizer: str, out: str, extra: list) -> list:
    """`pileprep shard` with the default options on the corpus, with the tree's own Python."""
    files = corpus_files(corpus)
    return [os.path.join(tree, ".venv", "bin", "python"), "-m", "pipeline.cli", "shard", "--input", *files["train"],
            "--val-input", files["val"], "--test-input", files["test"], "--output", out, "--tokenizer", tokenizer,
            "--progress-every", "0", *extra]


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux prctl PR_SET_CHILD_SUBREAPER), so a worker
    that outlives its parent is still counted in RUSAGE_CHILDREN once reaped (`reap_orphans`)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_orphans() -> None:
    """Wait for every descendant that was handed to this process, so its CPU is in RUSAGE_CHILDREN."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def run_once(tree: str, label: str, corpus: str, tokenizer: str, out_dir: str, name: str, extra: list) -> dict:
    out = os.path.join(out_dir, name)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out + "-logs", exist_ok=True)
    env = dict(os.environ, PYTHONPATH=tree, OMP_WAIT_POLICY="PASSIVE",
               PILEPREP_TOKENIZER_CACHE=os.path.join(out_dir, f"cache-{label}"))
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(os.path.join(out + "-logs", "stdout"), "w") as so, open(os.path.join(out + "-logs", "stderr"), "w") as se:
        run = run_measured(shard_command(tree, corpus, tokenizer, out, extra), env, tree, so, se)
    reap_orphans()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    tree_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if run["returncode"] != 0:
        with open(os.path.join(out + "-logs", "stderr")) as f:
            raise SystemExit(f"{label}: pileprep shard exited {run['returncode']}:\n{f.read()[-3000:]}")
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    section = manifest.get("tokenizer_backend") or {}
    tokens = sum(s["tokens"] for s in manifest["splits"].values())
    shutil.rmtree(out, ignore_errors=True)
    return {"label": label, "wall": run["wall"], "cpu_s": tree_cpu, "cli_cpu_s": run["cpu_s"], "tokens": tokens,
            "tokens_per_cpu_s": tokens / tree_cpu, "largest_mb": run["largest_mb"], "tree_mb": run["tree_mb"],
            "load_before": load, "load_after": os.getloadavg()[0], "backend": section.get("name", "?"),
            "by_backend": section.get("documents_by_backend")}


def describe(r: dict) -> str:
    by = r["by_backend"]
    routed = ("all documents to " + r["backend"]) if by is None else ", ".join(
        f"{name} {v['documents']:,} docs / {v['bytes'] / 1e6:.2f} MB" for name, v in by.items())
    return (f"wall {r['wall']:6.2f} s, CPU {r['cpu_s']:6.2f} s, {r['tokens']:,} tokens, "
            f"(CLI's wait4 {r['cli_cpu_s']:.2f} s), {r['tokens_per_cpu_s'] / 1e6:.3f} M tokens/CPU-s, RSS {r['largest_mb']:.0f} / {r['tree_mb']:.0f} MB, "
            f"load {r['load_before']:.2f} -> {r['load_after']:.2f}; {routed}")


def _spread(values: list) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def summary(labels: list, rounds: list) -> None:
    """Medians and spreads per tree; ratios to the first tree (of medians, and median of per-round ratios)."""
    print("\n| tree | runs | wall s median (min–max) | CPU s median (min–max) | M tokens/CPU-s median | "
          "largest / tree RSS MB (max) | load before runs |")
    print("|---|---|---|---|---|---|---|")
    for label in labels:
        rs = [rd[label] for rd in rounds]
        print(f"| {label} | {len(rs)} | {_spread([r['wall'] for r in rs])} | {_spread([r['cpu_s'] for r in rs])} "
              f"| {statistics.median(r['tokens_per_cpu_s'] for r in rs) / 1e6:.3f} "
              f"| {max(r['largest_mb'] for r in rs):.0f} / {max(r['tree_mb'] for r in rs):.0f} "
              f"| {', '.join(format(r['load_before'], '.1f') for r in rs)} |")
    base = labels[0]
    print(f"\n| ratio to {base} | wall: of medians / median of rounds (min–max) | "
          f"CPU: of medians / median of rounds (min–max) | tokens/CPU-s: of medians |")
    print("|---|---|---|---|")
    for label in labels[1:]:
        cells = []
        for key in ("wall", "cpu_s"):
            per_round = [rd[label][key] / rd[base][key] for rd in rounds]
            of_medians = statistics.median(rd[label][key] for rd in rounds) / statistics.median(
                rd[base][key] for rd in rounds)
            cells.append(f"{of_medians:.3f} / {_spread(per_round)}")
        tpc = statistics.median(rd[label]["tokens_per_cpu_s"] for rd in rounds) / statistics.median(
            rd[base]["tokens_per_cpu_s"] for rd in rounds)
        print(f"| {label} / {base} | {cells[0]} | {cells[1]} | {tpc:.3f} |")
    tokens = {label: {rd[label]["tokens"] for rd in rounds} for label in labels}
    if len({t for s in tokens.values() for t in s}) != 1:
        print(f"\nWARNING: token counts differ between runs: {tokens}")


def split_timing(corpus: str, tokenizer_path: str) -> None:
    """Where the routing's CPU goes, in this process, on every document of the corpus (one thread)."""
    from transforms.tokenize import tokenizer as tk  # noqa: PLC0415
    from transforms.tokenize import tokenizer_backends as tb  # noqa: PLC0415

    data = tk.read_model_bytes(tokenizer_path)
    ref = tk.load_processor(data, tokenizer_path)
    encoder = tb.GigatokenEncoder(data, ref, spot_check_every=0)
    clock = time.process_time
    t0 = clock()
    domain = tb.derive_domain("gigatoken", data, ref, encoder)
    derive_s = clock() - t0
    router = domain.router()
    texts = list(iter_texts(corpus))
    size = sum(map(tb.utf8_size, texts))

    def timed(fn, batch):
        """Best of two CPU timings. The process's gigatoken tokenizer keeps its pre-token cache between calls
        (fast_encoders._gigatoken_tokenizer: one per file and process), so every timing runs after a warm-up
        pass over all the texts below: warm against warm, as a worker is after its first units."""
        best = float("inf")
        for _ in range(2):
            t = clock()
            fn(encoder, batch)
            best = min(best, clock() - t)
        return best

    def encode_all(enc, batch):
        for i in range(0, len(batch), 64):
            enc._encode_all(batch[i:i + 64])  # noqa: SLF001 - the fast backend's own call, no routing

    t = clock()
    flags = [router.admits(x) for x in texts]
    admits_s = clock() - t
    admitted = [x for x, ok in zip(texts, flags) if ok]
    rejected = [x for x, ok in zip(texts, flags) if not ok]
    encode_all(encoder, texts)  # the warm-up pass
    all_fast_s = timed(encode_all, texts)
    admitted_fast_s = timed(encode_all, admitted)
    rejected_fast_s = timed(encode_all, rejected)
    rejected_ref_s = timed(lambda _enc, batch: [ref.encode(x) for x in batch], rejected)
    rej_bytes = sum(map(tb.utf8_size, rejected))
    print(f"\n## split timing, one thread, CPU-s (encodes: warm, best of 2) ({tokenizer_path})")
    print(f"domain: {domain.excluded_code_points:,} code points excluded in {len(domain.excluded_ranges)} ranges, "
          f"{len(domain.excluded_texts)} texts; derive_domain, empty cache (once per machine and file) {derive_s:.2f} CPU-s")
    print(f"documents {len(texts):,} ({size / 1e6:.1f} MB); sent to the reference {len(rejected):,} "
          f"({rej_bytes / 1e6:.2f} MB, {100 * rej_bytes / size:.2f}% of bytes)")
    print(f"| part | CPU-s |\n|---|---|\n| Router.admits, every document | {admits_s:.3f} |")
    print(f"| gigatoken, every document (before: no routing) | {all_fast_s:.3f} |")
    print(f"| gigatoken, admitted documents | {admitted_fast_s:.3f} |")
    print(f"| gigatoken on the rejected documents (what they would cost fast) | {rejected_fast_s:.3f} |")
    print(f"| reference on the rejected documents (what they cost now) | {rejected_ref_s:.3f} |")
    # The routing's extra CPU, from its own parts: two full passes of the same encoder differ by several percent
    # from one to the next on a shared machine, more than the cost measured.
    extra = admits_s + rejected_ref_s - rejected_fast_s
    print(f"routing's extra tokenize CPU = admits + reference − gigatoken on the rejected = {admits_s:.3f} + "
          f"{rejected_ref_s:.3f} − {rejected_fast_s:.3f} = {extra:.3f} CPU-s, {100 * extra / all_fast_s:.2f}% of "
          f"gigatoken's encode of every document")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", nargs="+", default=[], help="repository trees; the first is the baseline")
    p.add_argument("--labels", nargs="+", default=None, help="one name per tree (default: the folders' names)")
    p.add_argument("--runs", type=int, default=3, help="timed rounds (every tree once per round)")
    p.add_argument("--corpus", default=DEFAULT_CORPUS, help="a `pileprep sample` output folder")
    p.add_argument("--tokenizer", default=SHARED_TOKENIZER)
    p.add_argument("--shard-args", default="", help="extra `pileprep shard` arguments, one string")
    p.add_argument("--out-dir", default=os.path.join(REPO, "out", "bench", "routing"))
    p.add_argument("--no-cold", action="store_true", help="skip the first run with an empty tokenizer cache")
    p.add_argument("--split", action="store_true", help="time the routing's parts in this process (this tree)")
    args = p.parse_args(argv)
    # the runs' working folder is each tree, so every path they are given is absolute
    args.corpus, args.tokenizer, args.out_dir = map(os.path.abspath, (args.corpus, args.tokenizer, args.out_dir))
    args.trees = [os.path.abspath(t) for t in args.trees]
    labels = args.labels or [os.path.basename(os.path.normpath(t)) for t in args.trees]
    if len(labels) != len(args.trees) or len(set(labels)) != len(labels):
        p.error("--labels: one distinct name per tree")
    if not os.path.isdir(os.path.join(args.corpus, "train")):
        p.error(f"--corpus {args.corpus}: not a `pileprep sample` output (build it: pileprep sample --size-mb 384)")
    extra = shlex.split(args.shard_args)
    os.makedirs(args.out_dir, exist_ok=True)
    if not become_subreaper():
        print("warning: not a subreaper; CPU counts only the workers the CLI itself reaped", flush=True)
    print(f"routing_cost_bench: corpus {args.corpus}; tokenizer {args.tokenizer}; {args.runs} rounds; "
          f"trees {', '.join(f'{lb}={t}' for lb, t in zip(labels, args.trees))}; extra {extra}", flush=True)
    if args.trees and not args.no_cold:
        for tree, label in zip(args.trees, labels):
            shutil.rmtree(os.path.join(args.out_dir, f"cache-{label}"), ignore_errors=True)
            r = run_once(tree, label, args.corpus, args.tokenizer, args.out_dir, f"{label}-cold", extra)
            print(f"{label:>8} cold cache: {describe(r)}", flush=True)
    rounds = []
    for i in range(args.runs if args.trees else 0):
        order = list(zip(args.trees, labels))
        order = order if i % 2 == 0 else order[::-1]
        rd = {}
        for tree, label in order:
            rd[label] = run_once(tree, label, args.corpus, args.tokenizer, args.out_dir, f"{label}-{i}", extra)
            print(f"{label:>8} round {i + 1}: {describe(rd[label])}", flush=True)
        rounds.append(rd)
    if rounds:
        summary(labels, rounds)
    if args.split:  # its own cache folder, emptied: the domain's derivation is timed cold
        cache = os.path.join(args.out_dir, "cache-split")
        shutil.rmtree(cache, ignore_errors=True)
        os.environ["PILEPREP_TOKENIZER_CACHE"] = cache
        split_timing(args.corpus, args.tokenizer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
