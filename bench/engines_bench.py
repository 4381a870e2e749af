"""FnApiRunner, Dask, Spark and Flink on the same input, alternating, in one run: wall, CPU-seconds of every process
involved (driver, job server, cluster JVMs, SDK workers) and the ratio to FnApiRunner; each engine's start-up
(cluster start, printed apart, not counted in the runs). Outputs must be byte-identical (printed).

Needs `make engines`. The clusters are the ones `make spark-cluster` / `make flink-cluster` start
(pipeline/ops/engines/cluster.py) and a Dask scheduler + 2 worker processes (as bench/dask_bench.py). The 96 MB and
384 MB corpora of docs/BENCHMARKS.md:

    python bench/engines_bench.py --input $C/train/*.jsonl.zst --tokenizer ../shared/data/tokenizers/llama2-bpe-32k.model \
        --repeat 3 -- --unit-mb 3 --target-shard-mb 16
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
_spec = importlib.util.spec_from_file_location("dask_bench", REPO / "bench" / "dask_bench.py")
dask_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dask_bench)

from pipeline.ops.engines import cluster as engine_cluster  # noqa: E402


def _start_dask(tmp: pathlib.Path, workers: int):
    port = dask_bench._free_port()
    sched = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                              "--port", str(port), "--no-dashboard"], env=dask_bench._env(), cwd=tmp,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    worker = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", f"tcp://127.0.0.1:{port}",
                               "--nworkers", str(workers), "--nthreads", "1", "--no-dashboard",
                               "--local-directory", str(tmp / "dask-work")], env=dask_bench._env(), cwd=tmp,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    from distributed import Client

    with Client(f"tcp://127.0.0.1:{port}", timeout=60) as c:
        c.wait_for_workers(workers, timeout=120)
    return [sched, worker], f"tcp://127.0.0.1:{port}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", nargs="+", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--repeat", type=int, default=2)
    argv = sys.argv[1:]
    shard_args = argv[argv.index("--") + 1:] if "--" in argv else ["--num-shards", "4"]
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.shard_args = shard_args
    args.input = [os.path.abspath(p) for p in args.input]
    args.tokenizer = os.path.abspath(args.tokenizer)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="engines-bench-"))
    started, spark, flink, dask_procs = {}, None, None, []
    try:
        t0 = time.monotonic()
        dask_procs, dask_address = _start_dask(tmp, 2)
        started["Dask"] = time.monotonic() - t0
        t0 = time.monotonic()
        spark = engine_cluster.start_spark(tmp / "spark", env=dask_bench._env())
        started["Spark"] = time.monotonic() - t0
        t0 = time.monotonic()
        flink = engine_cluster.start_flink(tmp / "flink", env=dask_bench._env())
        started["Flink"] = time.monotonic() - t0
        for name, s in started.items():
            print(f"{name} cluster start-up: {s:.1f} s (not counted below)", flush=True)
        procs = lambda c: [psutil.Process(p["pid"]) for p in c.processes]  # noqa: E731
        runs = {"FnApiRunner": ([], ()),
                "Dask": (["--runner=DaskRunner", f"--dask_client_address={dask_address}"],
                         [psutil.Process(p.pid) for p in dask_procs]),
                "Spark": (spark.beam_args, procs(spark)),
                "Flink": (flink.beam_args, procs(flink))}
        results = {name: [] for name in runs}
        for i in range(args.repeat):
            order = list(runs) if i % 2 == 0 else list(reversed(runs))
            for name in order:
                wall, cpu, digest = dask_bench._run(args, tmp / "out", *runs[name])
                results[name].append((wall, cpu, digest))
                print(f"round {i + 1} {name}: {wall:.2f} s wall, {cpu:.1f} CPU-s, load {dask_bench._load()}",
                      flush=True)
        base_w = statistics.median(r[0] for r in results["FnApiRunner"])
        base_c = statistics.median(r[1] for r in results["FnApiRunner"])
        print("\n| runner | median wall s | median CPU-s | wall / FnApiRunner | CPU / FnApiRunner | start-up s |")
        print("|---|---|---|---|---|---|")
        for name, rs in results.items():
            w, c = statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)
            print(f"| {name} | {w:.1f} | {c:.1f} | {w / base_w:.2f} | {c / base_c:.2f} | "
                  f"{started.get(name, 0):.1f} |")
        digests = {r[2] for rs in results.values() for r in rs}
        print(f"\noutputs byte-identical across runners and rounds: {len(digests) == 1}")
    finally:
        for c in (spark, flink):
            if c is not None:
                engine_cluster.stop(pathlib.Path(c.state_dir))
        for p in dask_procs:  # the Dask processes this script started, each in its own session
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
