"""Shard throughput and memory at 1×, 4× and 16× input against raw SentencePiece, measured in one run.

    python bench/shard_bench.py [--tokenizer MODEL] [--backends sentencepiece auto] [--quick]
                                [--beam-args '--direct_num_workers=2 ...'] [--cache-dir out/bench]

1. corpora: `pileprep sample --size-mb N` at 24 MB (1×), 96 MB (4×) and 384 MB (16×), built once into
   `--cache-dir` (default out/bench/, reused while the sample code and the installation are unchanged);
2. reference: raw `sp.encode(text)` of every document of each corpus, one thread, only the encode calls timed,
   best of two passes (one before the pipeline runs, one after: load from other work on a shared machine rarely
   spoils both): tokens/s per core for that corpus (the corpora differ in their mix of text, so each has its
   own rate; a sample would miss SentencePiece's heavy tail of slow documents);
3. the real CLI, `python -m pipeline.cli shard ...`, in a fresh process per run, with pileprep's default
   runner (no --runner/--direct_* flags unless `--beam-args` gives them), once per `--backends` entry. Wall time
   is taken around the whole process (start to exit, the user's view) and from the job's own summary line
   (`wall time`). Runs: best of two at 1× and 4×, one at 16× (`--quick`: 1× and 4×, one run each). Units are
   `--unit-mb 3` at every size (the 1× train files hold ~3 MB each), so peak RSS compares corpus sizes;
4. ratios in raw single-thread seconds: raw_s = corpus tokens / that corpus's raw rate, i.e. how long one core
   of bare SentencePiece needs for the whole corpus. End to end: raw_s / (workers × wall); marginal between two
   sizes: Δraw_s / (workers × Δwall); fixed start-up: the intercept of wall against raw_s (1× and 4×).
   1.0 means the pipeline keeps `workers` cores as busy as bare SentencePiece would; a fast exact backend
   (`auto`) can pass 1.0 because it spends less CPU than SentencePiece per token;
5. peak RSS: the largest single process (the kernel's ru_maxrss of the CLI process and every worker it reaped,
   from wait4) and the whole process tree (RSS summed over the tree, sampled every 50 ms), at each size, with
   the 4×/1× and 16×/1× ratios.

Output ends with markdown tables for the issue note. Tokenization is ~99% of the CPU cost of sharding, so these
ratios say how much the pipeline wastes around it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import threading
import time
from importlib import metadata

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from transforms.shard.documents import Document, parse_record  # noqa: E402
from transforms.io.read_records import RawRecord, compression_of, iter_raw_records  # noqa: E402

SHARED_TOKENIZER = os.path.join(os.path.dirname(REPO), "shared", "data", "tokenizers", "llama2-bpe-32k.model")
SAMPLE_TOKENIZER = os.path.join(REPO, "out", "tokenizer", "sample-8k.model")  # `make bench` trains it if needed
BASE_MB = 24
FACTORS = (1, 4, 16)
SAMPLE_EVERY_S = 0.05
MB = 1e6
MiB = 1 << 20
# The targets, checked at the end: (backend kind, figure, size key, target)
TARGETS = [("sentencepiece", "end to end", 4, 0.75), ("sentencepiece", "marginal", (1, 4), 0.95),
           ("fast", "end to end", 4, 1.0), ("fast", "end to end", 16, 1.5)]
RSS_TARGET = 1.1

try:  # the tree-RSS sampler of the memory benchmark (psutil, part of the `test` extra)
    import psutil

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from memory_bench import tree_rss as _psutil_tree_rss  # noqa: E402

    def tree_rss(pid: int) -> int:
        return _psutil_tree_rss(psutil.Process(pid))
except ImportError:  # no psutil: the same sum read from /proc
    def _children(pid: int) -> list:
        kids = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids += [int(x) for x in f.read().split()]
        except OSError:
            pass
        return kids

    def tree_rss(pid: int) -> int:
        total, todo, page = 0, [pid], os.sysconf("SC_PAGE_SIZE")
        while todo:
            p = todo.pop()
            try:
                with open(f"/proc/{p}/statm") as f:
                    total += int(f.read().split()[1]) * page
            except (OSError, IndexError, ValueError):
                continue
            todo += _children(p)
        return total


# ------------------------------------------------------------------------------------------------ corpora
def _installation_fingerprint() -> str:
    """What the sample corpus is made of: the sample code, this Python, and every installed distribution."""
    h = hashlib.sha256()
    with open(os.path.join(REPO, "pipeline", "tools", "sample_corpus.py"), "rb") as f:
        h.update(f.read())
    h.update(f"{sys.prefix}\0{sys.version}\0".encode())
    for name in sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()):
        h.update(name.encode() + b"\0")
    return h.hexdigest()


def _env(repo: str = REPO) -> dict:
    return dict(os.environ, PYTHONPATH=repo, OMP_WAIT_POLICY="PASSIVE")


def build_corpus(cache_dir: str, size_mb: int, fingerprint: str, rebuild: bool) -> dict:
    """`pileprep sample --size-mb N` into cache_dir/corpus-<N>mb, unless a build for this installation is there."""
    root = os.path.join(cache_dir, f"corpus-{size_mb}mb")
    stamp = os.path.join(root, ".bench-stamp.json")
    if not rebuild and os.path.exists(stamp):
        with open(stamp) as f:
            saved = json.load(f)
        if saved.get("fingerprint") == fingerprint:
            saved["summary"].update(reused=True, output_dir=root)
            return saved["summary"]
    shutil.rmtree(root, ignore_errors=True)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "sample", "--output", root,
                           "--size-mb", str(size_mb)], capture_output=True, text=True, env=_env(), cwd=REPO,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"pileprep sample --size-mb {size_mb} failed: {proc.stderr.strip()[-2000:]}")
    summary = json.loads(proc.stdout)
    summary["build_s"] = time.perf_counter() - start
    with open(stamp + ".tmp", "w") as f:
        json.dump({"fingerprint": fingerprint, "summary": summary}, f)
    os.replace(stamp + ".tmp", stamp)
    summary["reused"] = False
    return summary


def corpus_files(root: str) -> dict:
    return {"train": sorted(os.path.join(root, "train", n) for n in os.listdir(os.path.join(root, "train"))
                            if n.endswith(".jsonl.zst")),
            "val": os.path.join(root, "val.jsonl.zst"), "test": os.path.join(root, "test.jsonl.zst")}


# ------------------------------------------------------------------------------------------- the reference
def iter_texts(root: str):
    """Every document's text of a corpus (train, val, test files), read and parsed as the job reads them."""
    files = corpus_files(root)
    for path in [*files["train"], files["val"], files["test"]]:
        with open(path, "rb") as f:
            for item in iter_raw_records(f, compression_of(path)):
                if isinstance(item, RawRecord):
                    doc = parse_record(item.data)
                    if isinstance(doc, Document):
                        yield doc.text


class RawReference:
    """Raw single-thread `sp.encode(text)` of every document of one corpus: the CPU floor of the job.

    Every document, not a sample: SentencePiece's time per token is heavy-tailed (long lines without spaces are
    several times slower; the slowest 1% of documents take ~20% of the time on the 96 MB corpus), and a seeded
    sample of ~8 MB read 1.18 M tokens/s where the whole corpus reads 1.01 M (measured). Only the encode calls
    are timed; reading and parsing are not. Best of two passes, one before the pipeline runs and one after
    them, so a burst of load from other work on a shared machine during one pass does not set the reference."""

    def __init__(self, model: str, root: str):
        import sentencepiece as spm  # noqa: PLC0415

        self.sp = spm.SentencePieceProcessor(model_file=model)
        self.root = root
        self.documents = 0
        self.bytes = 0
        self.tokens = 0
        self.passes = []

    def measure(self) -> float:
        encode, clock = self.sp.encode, time.perf_counter
        documents = n_bytes = tokens = 0
        spent = 0.0
        for text in iter_texts(self.root):
            start = clock()
            tokens += len(encode(text))
            spent += clock() - start
            documents += 1
            n_bytes += len(text.encode("utf-8"))
        self.documents, self.bytes, self.tokens = documents, n_bytes, tokens
        self.passes.append(spent)
        return tokens / spent

    @property
    def rate(self) -> float:
        return self.tokens / min(self.passes)

    def rates(self) -> list:
        return [self.tokens / s for s in self.passes]


# -------------------------------------------------------------------------------------------- the pipeline
class ShardRunFailed(RuntimeError):
    """A `pileprep shard` run exited non-zero; the message holds its command line and stderr's tail."""


_WALL = re.compile(r"^wall time\s+([\d,.]+)s\s*$", re.M)


# Units of the same size at every corpus size (the 1× sample's train files hold ~3 MB each): peak RSS then
# compares corpus sizes, not the units' growth up to --unit-mb, which is the bound by design.
UNIT_MB = 3


def run_measured(args: list, env: dict, cwd: str, stdout, stderr) -> dict:
    """Run a command to its end: exit code, wall (start to exit), CPU seconds (user + system) of the process and
    every child it reaped (wait4's rusage), peak RSS of the largest process (wait4's ru_maxrss) and of the whole
    process tree (sampled every 50 ms)."""
    start = time.perf_counter()
    child = subprocess.Popen(args, stdout=stdout, stderr=stderr, env=env, cwd=cwd)
    peak_tree, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            try:
                peak_tree[0] = max(peak_tree[0], tree_rss(child.pid))
            except Exception:  # noqa: BLE001 - the process tree changes under us; the next sample counts
                pass
            done.wait(SAMPLE_EVERY_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    sampler.join()
    return {"returncode": child.returncode, "wall": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "largest_mb": usage.ru_maxrss * 1024 / MiB,
            "tree_mb": peak_tree[0] / MiB}


def shard_args(root: str, tokenizer: str, out: str, backend: str, seq_len: int, beam_args: list) -> list:
    """The `pileprep shard` command line the bench runs on a corpus (bench/dry_run_bench.py runs it too)."""
    files = corpus_files(root)
    return [sys.executable, "-m", "pipeline.cli", "shard", "--input", *files["train"],
            "--val-input", files["val"], "--test-input", files["test"], "--output", out,
            "--tokenizer", tokenizer, "--seq-len", str(seq_len), "--target-shard-mb", "16",
            "--unit-mb", str(UNIT_MB), "--tokenizer-backend", backend, "--progress-every", "0", *beam_args]


def run_pipeline(root: str, tokenizer: str, out: str, backend: str, seq_len: int, beam_args: list,
                 repo: str = REPO) -> dict:
    """One `pileprep shard` in a fresh process, with the code of checkout `repo` (default: this one): wall
    (process and job), CPU, tokens, output bytes, backend, peak RSS."""
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out + "-logs", exist_ok=True)
    args = shard_args(root, tokenizer, out, backend, seq_len, beam_args)
    with open(os.path.join(out + "-logs", "stdout"), "w+") as so, open(os.path.join(out + "-logs", "stderr"),
                                                                       "w+") as se:
        run = run_measured(args, _env(repo), repo, so, se)
        so.seek(0)
        se.seek(0)
        stdout, stderr = so.read(), se.read()
    if run["returncode"] != 0:
        raise ShardRunFailed(f"pileprep shard failed (exit {run['returncode']}): "
                             f"{' '.join(map(shlex.quote, args))}\n{stderr.strip()[-3000:]}")
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    job = _WALL.search(stdout)
    chosen = manifest.get("tokenizer_backend") or {}
    result = {"wall": run["wall"], "job_wall": float(job.group(1).replace(",", "")) if job else None,
              "tokens": sum(s["tokens"] for s in manifest["splits"].values()),
              "documents": sum(s["documents"] for s in manifest["splits"].values()),
              "backend_ran": chosen.get("name", "sentencepiece" if backend == "sentencepiece" else "?"),
              "backend_reason": chosen.get("reason", ""), "cpu_s": run["cpu_s"],
              "output_bytes": sum(s["bytes"] for s in manifest["shards"]), "shards": len(manifest["shards"]),
              "largest_mb": run["largest_mb"], "tree_mb": run["tree_mb"]}
    shutil.rmtree(out, ignore_errors=True)  # the 16× output is ~0.5 GB; only the figures are kept
    return result


def best_of(runs: list) -> dict:
    """The fastest run (its job wall with it); peak RSS as the largest seen in any run."""
    best = dict(min(runs, key=lambda r: r["wall"]))
    best["largest_mb"] = max(r["largest_mb"] for r in runs)
    best["tree_mb"] = max(r["tree_mb"] for r in runs)
    best["runs"] = len(runs)
    return best


# ----------------------------------------------------------------------------------------------- figures
def figures(results: dict, raw: dict, workers: int) -> dict:
    """Ratios against raw single-thread seconds (see the module docstring)."""
    f = {"sizes": {}}
    for k, r in results.items():
        raw_s = r["tokens"] / raw[k].rate
        f["sizes"][k] = {"raw_s": raw_s, "e2e": raw_s / (workers * r["wall"]),
                         "e2e_job": raw_s / (workers * r["job_wall"]) if r["job_wall"] else None,
                         "tokens_per_s": r["tokens"] / r["wall"]}
    sizes = sorted(results)
    f["marginal"], f["marginal_job"] = {}, {}
    for a, b in zip(sizes, sizes[1:]):
        d_raw = f["sizes"][b]["raw_s"] - f["sizes"][a]["raw_s"]
        for key, wall in (("marginal", "wall"), ("marginal_job", "job_wall")):
            if results[a][wall] is None or results[b][wall] is None:
                continue
            d_wall = results[b][wall] - results[a][wall]
            f[key][(a, b)] = d_raw / (workers * d_wall) if d_wall > 0 else math.inf
    f["fixed"], f["fixed_job"] = None, None
    if 1 in results and 4 in results:
        for key, wall in (("fixed", "wall"), ("fixed_job", "job_wall")):
            w1, w4 = results[1][wall], results[4][wall]
            if w1 is None or w4 is None:
                continue
            r1, r4 = f["sizes"][1]["raw_s"], f["sizes"][4]["raw_s"]
            slope = (w4 - w1) / (r4 - r1)
            f[key] = w1 - slope * r1
    return f


def _ratio(x) -> str:
    return "n/a" if x is None else "inf" if x == math.inf else f"{x:.2f}"


def _secs(x) -> str:
    return "n/a" if x is None else f"{x:.1f}"


def _gap(x: float) -> str:
    """A miss as printed: one significant digit when 2 decimals would round it to "0.00" (1.104 against 1.1)."""
    return f"{x:.2f}" if x >= 0.005 else f"{x:.1g}"


def target_lines(backend_ran: str, fig: dict) -> list:
    kind = "sentencepiece" if backend_ran == "sentencepiece" else "fast"
    out = []
    for want_kind, what, size, target in TARGETS:
        if want_kind != kind:
            continue
        if what == "marginal":
            got, label = fig["marginal"].get(size), f"marginal {size[1]}×−{size[0]}×"
        else:
            got, label = fig["sizes"].get(size, {}).get("e2e"), f"end to end {size}×"
        if got is None:
            continue
        verdict = "met" if got >= target else f"missed by {_gap(target - got)}"
        out.append(f"{label} {got:.2f} (target ≥ {target}): {verdict}")
    return out


def rss_ratios(results: dict, key: str) -> dict:
    return {k: results[k][key] / results[1][key] for k in sorted(results) if k != 1 and 1 in results}


def print_report(corpora: dict, raw: dict, by_backend: dict, workers: int, tokenizer: str) -> None:
    print("\n## shard_bench summary")
    print(f"tokenizer {tokenizer}; {workers} workers (the ratios' denominator); "
          f"wall = whole `pileprep shard` process (start to exit) / the job's own `wall time`")
    print("\nraw SentencePiece, one thread, `sp.encode(text)` of every document of each corpus, "
          "best of 2 passes (before / after the pipeline runs):\n")
    print("| corpus | documents | MB | encoded docs | text MB | raw tokens/s/core | passes |")
    print("|---|---|---|---|---|---|---|")
    for k in sorted(raw):
        c = corpora[k]
        print(f"| {k}× ({k * BASE_MB} MB) | {sum(c['documents'].values()):,} | {c['uncompressed_bytes'] / MB:.0f} "
              f"| {raw[k].documents:,} | {raw[k].bytes / MB:.1f} | {raw[k].rate / 1e6:.2f} M "
              f"| {' / '.join(f'{x / 1e6:.2f}' for x in raw[k].rates())} |")
    print("\nratio = raw single-thread seconds for the corpus ÷ (workers × wall); "
          "marginal = Δraw-s ÷ (workers × Δwall)\n")
    print("| backend (ran) | corpus | runs | tokens | raw 1-thread s | wall s process / job | tokens/s | "
          "end-to-end ratio process / job | peak RSS largest / tree MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for backend, (results, fig) in by_backend.items():
        for k in sorted(results):
            r, s = results[k], fig["sizes"][k]
            print(f"| {backend} ({r['backend_ran']}) | {k}× | {'best of ' if r['runs'] > 1 else ''}{r['runs']} "
                  f"| {r['tokens'] / 1e6:.1f} M | {s['raw_s']:.1f} | {r['wall']:.1f} / {_secs(r['job_wall'])} "
                  f"| {s['tokens_per_s'] / 1e6:.2f} M | {_ratio(s['e2e'])} / {_ratio(s['e2e_job'])} "
                  f"| {r['largest_mb']:.0f} / {r['tree_mb']:.0f} |")
    print("\n| backend (ran) | marginal 4×−1× process / job | marginal 16×−4× process / job | "
          "fixed start-up s process / job | largest-process RSS 4×/1×, 16×/1× | tree RSS 4×/1×, 16×/1× |")
    print("|---|---|---|---|---|---|")
    for backend, (results, fig) in by_backend.items():
        ran = results[min(results)]["backend_ran"]
        m = [f"{_ratio(fig['marginal'].get(pair))} / {_ratio(fig['marginal_job'].get(pair))}"
             for pair in ((1, 4), (4, 16))]
        largest = ", ".join(f"{v:.2f}" for v in rss_ratios(results, "largest_mb").values()) or "n/a"
        tree = ", ".join(f"{v:.2f}" for v in rss_ratios(results, "tree_mb").values()) or "n/a"
        print(f"| {backend} ({ran}) | {m[0]} | {m[1]} | {_secs(fig['fixed'])} / {_secs(fig['fixed_job'])} "
              f"| {largest} | {tree} |")
    print("\ntargets (ratios on process wall):")
    for backend, (results, fig) in by_backend.items():
        ran = results[min(results)]["backend_ran"]
        for line in target_lines(ran, fig):
            print(f"  {backend} ({ran}): {line}")
        for k, v in rss_ratios(results, "largest_mb").items():
            verdict = "met" if v <= RSS_TARGET else f"missed by {_gap(v - RSS_TARGET)}"
            print(f"  {backend} ({ran}): largest-process peak RSS {k}×/1× {v:.2f} (target ≤ {RSS_TARGET}): "
                  f"{verdict}")


def default_workers(beam_args: list) -> int:
    """The local workers the job gets: --direct_num_workers in --beam-args, else pileprep's default runner's
    (pipeline/beam_glue.py default_beam_args: one per core)."""
    from pipeline.beam_glue import default_beam_args  # noqa: PLC0415
    from pipeline.ops.runners import arg_value  # noqa: PLC0415

    given = arg_value(beam_args, "--direct_num_workers")
    return int(given if given is not None else arg_value(default_beam_args(), "--direct_num_workers"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", default=None,
                   help=f"SentencePiece model (default: {SHARED_TOKENIZER} when present, else {SAMPLE_TOKENIZER})")
    p.add_argument("--backends", nargs="+", default=["sentencepiece", "auto"],
                   help="--tokenizer-backend values to run the pipeline with (the reference is always raw "
                        "SentencePiece)")
    p.add_argument("--quick", action="store_true", help="1× and 4× only, one run each (development)")
    p.add_argument("--beam-args", default="", help="extra shard arguments, one string (e.g. Beam's runner flags); "
                                                   "default none: pileprep's default runner")
    p.add_argument("--workers", type=int, default=None,
                   help="cores the job uses, the ratios' denominator (default: --direct_num_workers in "
                        "--beam-args, else pileprep's default)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--cache-dir", default=os.path.join(REPO, "out", "bench"),
                   help="where the corpora are built (reused while the installation is unchanged) and the runs go")
    p.add_argument("--rebuild", action="store_true", help="rebuild the corpora even if cached")
    args = p.parse_args(argv)
    tokenizer = args.tokenizer or (SHARED_TOKENIZER if os.path.exists(SHARED_TOKENIZER) else SAMPLE_TOKENIZER)
    if not os.path.exists(tokenizer):
        raise SystemExit(f"tokenizer {tokenizer} not found: pass --tokenizer, or run `make bench`")
    beam_args = shlex.split(args.beam_args)
    workers = args.workers or default_workers(beam_args)
    factors = (1, 4) if args.quick else FACTORS
    repeats = {k: 1 if args.quick or k == 16 else 2 for k in factors}
    os.makedirs(args.cache_dir, exist_ok=True)
    print(f"shard_bench: tokenizer {tokenizer}; backends {' '.join(args.backends)}; {workers} workers; "
          f"runs: " + ", ".join(f"{k}× {'best of ' if n > 1 else ''}{n}" for k, n in repeats.items())
          + f"; beam args: {args.beam_args or '(pileprep defaults)'}", flush=True)

    fingerprint = _installation_fingerprint()
    corpora, raw = {}, {}
    for k in factors:
        c = corpora[k] = build_corpus(args.cache_dir, k * BASE_MB, fingerprint, args.rebuild)
        root = c["output_dir"]
        how = "cached" if c["reused"] else "built in {:.0f}s".format(c["build_s"])
        print(f"corpus {k}× ({k * BASE_MB} MB): {sum(c['documents'].values()):,} documents, "
              f"{c['uncompressed_bytes'] / MB:.0f} MB, {c.get('copies', 0):,} marked copies ({how}) in {root}",
              flush=True)
        raw[k] = RawReference(tokenizer, root)
        rate = raw[k].measure()
        print(f"  raw SentencePiece on all {raw[k].documents:,} documents ({raw[k].bytes / MB:.1f} MB of text): "
              f"{raw[k].tokens:,} tokens in {raw[k].passes[-1]:.2f}s = {rate:,.0f} tokens/s/core (pass 1)",
              flush=True)

    by_backend, failures = {}, []
    for backend in args.backends:
        results = {}
        for k in factors:
            runs = []
            for i in range(repeats[k]):
                out = os.path.join(args.cache_dir, "run", f"{backend}-{k}x-{i}")
                try:
                    r = run_pipeline(corpora[k]["output_dir"], tokenizer, out, backend, args.seq_len, beam_args)
                except ShardRunFailed as e:  # once: a shared machine's flake should not end a 15-minute run
                    failures.append(f"{backend} {k}× run {i + 1}: {str(e).splitlines()[-1]}")
                    print(f"{e}\n[{backend}] {k}× run {i + 1} failed; retrying it once", flush=True)
                    r = run_pipeline(corpora[k]["output_dir"], tokenizer, out, backend, args.seq_len, beam_args)
                runs.append(r)
                raw_s = r["tokens"] / raw[k].rate
                print(f"[{backend} → {r['backend_ran']}] {k}× run {i + 1}: {r['tokens']:,} tokens, wall "
                      f"{r['wall']:.1f}s (job {_secs(r['job_wall'])}s), "
                      f"ratio {raw_s / (workers * r['wall']):.2f} (reference pass 1), "
                      f"peak RSS largest {r['largest_mb']:.0f} MB / tree {r['tree_mb']:.0f} MB", flush=True)
            results[k] = best_of(runs)
        by_backend[backend] = results
    for k in factors:  # the reference's second pass, after the pipeline runs
        rate = raw[k].measure()
        print(f"raw SentencePiece {k}× pass 2: {rate:,.0f} tokens/s/core", flush=True)
    by_backend = {b: (results, figures(results, raw, workers)) for b, results in by_backend.items()}
    print_report(corpora, raw, by_backend, workers, tokenizer)
    for line in failures:
        print(f"failed and retried: {line}")
    print("\n(figures from a shared machine are noisy; best of 2 at 1× and 4×, one run at 16×)" if not args.quick
          else "\n(--quick: 1× and 4×, one run each)")
    return 0


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    try:
        sys.exit(main())
    except ShardRunFailed as failed:
        sys.exit(str(failed))
