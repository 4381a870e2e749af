"""Megatron-LM's fast script beside pileprep (issue 30): its run, and the tables bench/megatron_side_by_side.py
prints for it.

Megatron-LM's main branch (d98e8a64 or later: `git archive` of github.com/NVIDIA/Megatron-LM into a directory
outside this repository) has `tools/preprocess_data_fast.py`: with `--tokenizer-type HuggingFaceTokenizer
--use-gigatoken`, gigatoken reads the whole JSONL and tokenizes it on all cores in Rust
(`encode_files(JsonlFileSource(...), parallel=True)`), holds every token in memory (awkward arrays), then writes
`.bin/.idx`. It runs unchanged through bench/_megatron_entry.py (Python 3.11: `typing.override`), on the plain
`.jsonl` the bench writes before any clock starts, with the HF tokenizer dir of bench/megatron_tokenizer.py.

Figures per tool (each the median run by wall of `--repeat`): wall, CPU-s (user + system of the process and
every child it reaped), peak RSS of the largest process, tokens (Megatron's: its .bin over the .idx dtype,
one EOD per document included; pileprep's: its manifest's). Ratios pileprep ÷ fast: wall, CPU, peak RSS, and
the MARGINAL CPU per token between two sizes, each tool over its own tokens: (CPU_b - CPU_a) / (tokens_b -
tokens_a), so fixed start-up (imports, the tokenizer's load) cancels and what is left is the cost per token
that decides at the Pile's size.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from shard_bench import RSS_TARGET, run_measured

ENTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_megatron_entry.py")
# Megatron's indexed_dataset DType codes (megatron/core/datasets/indexed_dataset.py) -> bytes per token
MEGATRON_DTYPE_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}
FAST_SCRIPT = os.path.join("tools", "preprocess_data_fast.py")
FAST = "megatron-fast"
# issue 30's targets: wall at the largest size, marginal CPU per token over the last two sizes, peak RSS of the
# largest process at the largest size (all pileprep ÷ fast), and pileprep's own RSS growth over the sizes
WALL_TARGET, MARGINAL_TARGET, RSS_RATIO_TARGET = 0.80, 1.0, 0.5


def megatron_tokens(prefix: str) -> int:
    """Tokens Megatron wrote: its .bin's size over the dtype its .idx header names (9-byte magic, 8-byte version)."""
    with open(prefix + ".idx", "rb") as f:
        header = f.read(18)
    return os.path.getsize(prefix + ".bin") // MEGATRON_DTYPE_BYTES[header[17]]


def hf_tokenizer(model: str, hf_dir: str, check_jsonl: str | None = None) -> str:
    """Build (cached) the HF tokenizer dir, and with check_jsonl compare it with sp.encode on that corpus, in a
    child process (bench/megatron_tokenizer.py): its last line of output. Not in the bench's own process: Linux
    carries a parent's peak RSS into every child's ru_maxrss (exec records the old address space's high-water
    mark, and a vforked child's is the parent's), so transformers and 120 M tokens held here would become the
    floor of every tool's "largest process" figure (measured: 2,045 MB for pileprep at 384 MB; 932 MB tree)."""
    args = [sys.executable, os.path.join(os.path.dirname(ENTRY), "megatron_tokenizer.py"), "--tokenizer", model,
            "--out", hf_dir] + (["--check", check_jsonl] if check_jsonl else [])
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench/megatron_tokenizer.py failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip().splitlines()[-1]


def fast_script(fast_dir: str) -> str:
    script = os.path.join(fast_dir, FAST_SCRIPT)
    if not os.path.exists(script):
        raise SystemExit(f"{script} not found: --megatron-fast-dir must be a Megatron-LM checkout at d98e8a64 or "
                         f"later (main, August 2026)")
    return script


def run_megatron_script(checkout: str, script_args: list, out_dir: str) -> dict:
    """One of Megatron's preprocessing scripts (its path, then its arguments, `--output-prefix` excepted) in a
    fresh process through bench/_megatron_entry.py, measured: wall, CPU, tokens written, peak RSS."""
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    prefix = os.path.join(out_dir, "corpus")
    env = dict(os.environ, PYTHONPATH=checkout, OMP_WAIT_POLICY="PASSIVE", PYTHONWARNINGS="ignore")
    with open(os.path.join(out_dir, "log"), "w+") as log:
        run = run_measured([sys.executable, ENTRY, *script_args, "--output-prefix", prefix], env, out_dir, log,
                           subprocess.STDOUT)
        log.seek(0)
        text = log.read()
    if run["returncode"] != 0:
        raise SystemExit(f"Megatron's {os.path.basename(script_args[0])} failed:\n{text[-3000:]}")
    result = {"wall": run["wall"], "cpu_s": run["cpu_s"], "tokens": megatron_tokens(prefix + "_text_document"),
              "largest_mb": run["largest_mb"], "tree_mb": run["tree_mb"]}
    shutil.rmtree(out_dir, ignore_errors=True)
    return result


def run_megatron_fast(fast_dir: str, jsonl: str, hf_dir: str, out_dir: str) -> dict:
    """One run of the fast script with --use-gigatoken --append-eod, measured."""
    result = run_megatron_script(fast_dir, [fast_script(fast_dir), "--input", jsonl, "--tokenizer-type",
                                            "HuggingFaceTokenizer", "--tokenizer-model", hf_dir, "--use-gigatoken",
                                            "--append-eod"], out_dir)
    return dict(result, label="Megatron fast (gigatoken)")


def _per_m(seconds: float, tokens: int) -> float | None:
    """Seconds per million tokens; None for no tokens between two sizes (a size given twice, or `96 1x96`)."""
    return seconds / tokens * 1e6 if tokens else None


def marginal(ra: dict, rb: dict) -> dict:
    """Between two sizes of one tool: CPU-s and wall-s per million extra tokens, and the RSS growth."""
    d_tokens = rb["tokens"] - ra["tokens"]
    return {"cpu": _per_m(rb["cpu_s"] - ra["cpu_s"], d_tokens), "wall": _per_m(rb["wall"] - ra["wall"], d_tokens),
            "rss": rb["largest_mb"] / ra["largest_mb"]}


def _over(x: float | None, y: float | None) -> float | None:
    """x ÷ y, or None when either is not measured or not positive (a marginal cost lost in the noise of tiny
    sizes: a negative ratio would pass any target)."""
    return x / y if x is not None and y is not None and x >= 0 and y > 0 else None


def _fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def print_fast_tables(rows: list, others: list, label) -> None:
    """The issue 30 tables: per size, each pileprep tool ÷ Megatron's fast script; then the marginal cost per
    token between consecutive sizes; then the targets. rows: [(size label, documents, raw, {tool: run})];
    others: the pileprep tools in order; label(tool, run) -> its name."""
    rows = [row for row in rows if FAST in row[3]]
    if not rows:
        return
    print("\n## Issue 30: pileprep ÷ Megatron-LM's fast script (preprocess_data_fast.py --use-gigatoken)")
    print("CPU = user + system of the process tree; RSS = peak of the largest process; ÷ fast: pileprep's figure "
          "over the fast script's at the same size\n")
    print("| corpus | tool | tokens | wall s | CPU s | peak RSS MB | wall ÷ fast | CPU ÷ fast | RSS ÷ fast |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size, docs, _raw, results in rows:
        fast = results[FAST]
        for tool in [FAST, *others]:
            if tool not in results:
                continue
            r = results[tool]
            print(f"| {size}, {docs:,} docs | {label(tool, r)} | {r['tokens'] / 1e6:.1f} M | {r['wall']:.1f} "
                  f"| {r['cpu_s']:.1f} | {r['largest_mb']:.0f} | {r['wall'] / fast['wall']:.2f} "
                  f"| {r['cpu_s'] / fast['cpu_s']:.2f} | {r['largest_mb'] / fast['largest_mb']:.2f} |")
    pairs = list(zip(rows, rows[1:]))
    if pairs:
        print("\nMarginal cost between two sizes, each tool over its own tokens: (X_b - X_a) / (tokens_b - "
              "tokens_a)\n")
        print("| sizes | tool | CPU-s / M tokens | wall-s / M tokens | CPU ÷ fast | wall ÷ fast | RSS b ÷ a |")
        print("|---|---|---|---|---|---|---|")
        for (sa, _da, _ra, a), (sb, _db, _rb, b) in pairs:
            fast = marginal(a[FAST], b[FAST])
            for tool in [FAST, *others]:
                if tool not in a or tool not in b:
                    continue
                m = marginal(a[tool], b[tool])
                print(f"| {sa} → {sb} | {label(tool, b[tool])} | {_fmt(m['cpu'], 3)} | {_fmt(m['wall'], 3)} "
                      f"| {_fmt(_over(m['cpu'], fast['cpu']))} | {_fmt(_over(m['wall'], fast['wall']))} "
                      f"| {m['rss']:.2f} |")
    _print_targets(rows, others, label)


def _print_targets(rows: list, others: list, label) -> None:
    """Issue 30's targets at the largest size and over the last two sizes, each pileprep tool: met or missed."""
    size, _docs, _raw, last = rows[-1]
    print(f"\nIssue 30 targets (largest size {size}{f', marginal {rows[-2][0]} → {size}' if len(rows) > 1 else ''}):")
    for tool in others:
        if tool not in last:
            continue
        checks = [("wall ÷ fast", last[tool]["wall"] / last[FAST]["wall"], WALL_TARGET),
                  ("peak RSS ÷ fast", last[tool]["largest_mb"] / last[FAST]["largest_mb"], RSS_RATIO_TARGET)]
        if len(rows) > 1 and tool in rows[-2][3]:
            before = rows[-2][3]
            mine, fast = marginal(before[tool], last[tool]), marginal(before[FAST], last[FAST])
            checks += [("marginal CPU per token ÷ fast", _over(mine["cpu"], fast["cpu"]), MARGINAL_TARGET),
                       (f"peak RSS {rows[-2][0]} → {size}", mine["rss"], RSS_TARGET)]
        for name, value, target in checks:
            verdict = "not measured" if value is None else "met" if value <= target else "MISSED"
            print(f"- {label(tool, last[tool])}: {name} {_fmt(value)} (target <= {target:.2f}): {verdict}")
