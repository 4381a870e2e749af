"""`pileprep shard --dry-run` against the real run it estimates, at 96 MB and 384 MB.

    python bench/dry_run_bench.py [--sizes 96 384] [--tokenizer MODEL] [--backend auto]
                                  [--beam-args '...'] [--cache-dir out/bench]

For each size: the corpus of bench/shard_bench.py (`pileprep sample --size-mb N`, cached in --cache-dir), then
in fresh processes, with the command line bench/shard_bench.py runs (`shard_args`):

1. `pileprep shard ... --dry-run`: its printed core-hours (the `core-s` beside them) and output bytes;
2. the real `pileprep shard ...`: CPU seconds (user + system) of the whole process tree from wait4
   (bench/shard_bench.py `run_measured`), and the bytes of the shards its manifest lists;
3. once, the same command on a one-record input: the CPU every run pays to start (interpreter, imports, Beam,
   planning, commit). The dry run includes its own estimate of start-up in core-hours once and prints it
   apart (pipeline/tools/dry_run.py), so both readings are judged: its core-s against the real run's whole
   tree, and its core-s less its start-up against the real run's less this one-record run ("busy").

Prints estimated / measured with the ratio and whether it is within ±20% (the target), and the load average
before and after each run (the machine is shared: CPU seconds drift with contention).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shard_bench as sb  # noqa: E402

TOLERANCE = 0.20
_CORE_S = re.compile(r"^\s*core-hours\s+[\d,.]+\s+([\d,.]+) core-s.*?([\d,.]+) core-s of it start-up", re.M)
_OUTPUT = re.compile(r"^\s*output bytes\s+([\d,]+)\s", re.M)
_SHARDS = re.compile(r"^\s*shards\s+([\d,]+)\s", re.M)
_NOTE = re.compile(r"^\s*note: (core time calibrated.*)$", re.M)


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _run(args: list, log_dir: str) -> tuple:
    os.makedirs(log_dir, exist_ok=True)
    with open(os.path.join(log_dir, "stdout"), "w+") as so, open(os.path.join(log_dir, "stderr"), "w+") as se:
        run = sb.run_measured(args, sb._env(), sb.REPO, so, se)
        so.seek(0)
        se.seek(0)
        stdout, stderr = so.read(), se.read()
    if run["returncode"] != 0:
        raise SystemExit(f"exit {run['returncode']}: {' '.join(map(shlex.quote, args))}\n{stderr.strip()[-3000:]}")
    return run, stdout


def dry_run(root: str, tokenizer: str, out: str, backend: str, seq_len: int, beam_args: list, log_dir: str) -> dict:
    run, stdout = _run(sb.shard_args(root, tokenizer, out, backend, seq_len, beam_args) + ["--dry-run"], log_dir)
    core, output, shards = _CORE_S.search(stdout), _OUTPUT.search(stdout), _SHARDS.search(stdout)
    if not (core and output and shards):
        raise SystemExit(f"dry run printed no core-s / output bytes / shards:\n{stdout}")
    note = _NOTE.search(stdout)
    assert not os.path.exists(out), "the dry run wrote its output"
    return {"core_s": _num(core.group(1)), "startup_core_s": _num(core.group(2)), "output_bytes": _num(output.group(1)), "shards": int(_num(shards.group(1))),
            "wall": run["wall"], "cpu_s": run["cpu_s"], "note": note.group(1) if note else ""}


def one_record_corpus(root: str, cache_dir: str) -> str:
    """The first train record of a corpus as a corpus of its own (train file, val and test one record each)."""
    import zstandard  # noqa: PLC0415

    from transforms.io.read_records import RawRecord, compression_of, iter_raw_records  # noqa: PLC0415

    files = sb.corpus_files(root)
    with open(files["train"][0], "rb") as f:
        first = next(item.data for item in iter_raw_records(f, compression_of(files["train"][0]))
                     if isinstance(item, RawRecord))
    one = os.path.join(cache_dir, "corpus-one-record")
    shutil.rmtree(one, ignore_errors=True)
    os.makedirs(os.path.join(one, "train"))
    for path in (os.path.join(one, "train", "00.jsonl.zst"), os.path.join(one, "val.jsonl.zst"),
                 os.path.join(one, "test.jsonl.zst")):
        with open(path, "wb") as f:
            f.write(zstandard.ZstdCompressor().compress(first + b"\n"))
    return one


def _verdict(ratio: float) -> str:
    return "within ±20%" if abs(ratio - 1.0) <= TOLERANCE else "OUTSIDE ±20%"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[96, 384], help="corpus sizes in MB")
    p.add_argument("--tokenizer", default=None, help=f"default: {sb.SHARED_TOKENIZER} when present, else "
                                                     f"{sb.SAMPLE_TOKENIZER}")
    p.add_argument("--backend", default="auto", help="--tokenizer-backend (default auto, the CLI's default)")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--beam-args", default="", help="extra shard arguments, one string (default: pileprep's runner)")
    p.add_argument("--cache-dir", default=os.path.join(sb.REPO, "out", "bench"))
    args = p.parse_args(argv)
    tokenizer = args.tokenizer or (sb.SHARED_TOKENIZER if os.path.exists(sb.SHARED_TOKENIZER) else sb.SAMPLE_TOKENIZER)
    if not os.path.exists(tokenizer):
        raise SystemExit(f"tokenizer {tokenizer} not found: pass --tokenizer, or run `make bench`")
    beam_args = shlex.split(args.beam_args)
    os.makedirs(args.cache_dir, exist_ok=True)
    fingerprint = sb._installation_fingerprint()
    runs = os.path.join(args.cache_dir, "dry-run-bench")
    print(f"dry_run_bench: tokenizer {tokenizer}; backend {args.backend}; sizes {args.sizes} MB; "
          f"beam args {args.beam_args or '(pileprep defaults)'}; load average {loadavg()}", flush=True)

    corpora = {n: sb.build_corpus(args.cache_dir, n, fingerprint, False)["output_dir"] for n in args.sizes}
    one = one_record_corpus(corpora[args.sizes[0]], args.cache_dir)
    out = os.path.join(runs, "one-out")
    shutil.rmtree(out, ignore_errors=True)
    start, _ = _run(sb.shard_args(one, tokenizer, out, args.backend, args.seq_len, beam_args),
                    os.path.join(runs, "one-logs"))
    shutil.rmtree(out, ignore_errors=True)
    print(f"start-up (one-record run): {start['cpu_s']:.1f} CPU-s, wall {start['wall']:.1f}s", flush=True)

    rows = []
    for n in args.sizes:
        out = os.path.join(runs, f"{n}mb-out")
        shutil.rmtree(out, ignore_errors=True)
        load0 = loadavg()
        est = dry_run(corpora[n], tokenizer, out, args.backend, args.seq_len, beam_args,
                      os.path.join(runs, f"{n}mb-dry-logs"))
        print(f"{n} MB dry run: {est['core_s']:.1f} core-s, {est['output_bytes']:,.0f} output bytes, "
              f"{est['shards']} shards (the dry run itself: wall {est['wall']:.1f}s, {est['cpu_s']:.1f} CPU-s; "
              f"load {load0} → {loadavg()})\n  {est['note']}", flush=True)
        load1 = loadavg()
        real = sb.run_pipeline(corpora[n], tokenizer, out, args.backend, args.seq_len, beam_args)
        load2 = loadavg()
        busy = real["cpu_s"] - start["cpu_s"]
        print(f"{n} MB real run: {real['cpu_s']:.1f} CPU-s ({busy:.1f} above start-up), wall {real['wall']:.1f}s, "
              f"{real['tokens']:,} tokens, {real['output_bytes']:,} output bytes, {real['shards']} shards, "
              f"backend {real['backend_ran']}; "
              f"load {load1} → {load2}", flush=True)
        rows.append((n, est, real, busy, f"{load0} / {load2}"))

    print("\n## dry_run_bench summary")
    print(f"tokenizer {os.path.basename(tokenizer)}, backend {args.backend}, --seq-len {args.seq_len}; start-up "
          f"{start['cpu_s']:.1f} CPU-s (one-record run); core-s = CPU seconds (user + system) of the whole "
          "process tree\n")
    print("| corpus | figure | dry run | real run | ratio | ±20% | load (1/5/15 min) before / after |")
    print("|---|---|---|---|---|---|---|")
    failed = False
    for n, est, real, busy, load in rows:
        for what, e, m in (("core-s, whole tree (dry run with start-up)", est["core_s"], real["cpu_s"]),
                           ("core-s, less start-up (each its own)", est["core_s"] - est["startup_core_s"], busy),
                           ("output bytes", est["output_bytes"], real["output_bytes"]),
                           ("shards", est["shards"], real["shards"])):
            ratio = e / m if m else float("inf")
            judged = what.startswith("core-s") or what == "output bytes"
            failed |= judged and abs(ratio - 1.0) > TOLERANCE
            print(f"| {n} MB | {what} | {e:,.1f} | {m:,.1f} | {ratio:.3f} | "
                  f"{_verdict(ratio) if judged else '(shown)'} | {load} |")
    print("\njudged: core-s of the whole tree (the dry run includes its start-up estimate once), core-s less "
          "start-up on both sides, output bytes")
    print(json.dumps({"rows": [{"mb": n, "estimated": est, "real": {k: real[k] for k in ("cpu_s", "wall", "tokens",
                                                                                          "output_bytes", "shards")},
                                "busy_cpu_s": busy, "load": load} for n, est, real, busy, load in rows],
                      "startup_cpu_s": start["cpu_s"]}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
