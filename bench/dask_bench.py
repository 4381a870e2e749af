"""Dask cluster vs FnApiRunner on the same input: wall time and CPU seconds of every process involved.

Starts a real `dask scheduler` and `dask worker --nworkers N --nthreads 1` on 127.0.0.1 (separate processes),
runs `pileprep shard` on Dask --warmup times (the workers import Beam and pileprep on their first task, once per
cluster; printed, not counted), then --repeat rounds of FnApiRunner with N worker threads, FnApiRunner with N
worker processes (the two modes its default picks from: pipeline/ops/runners.py default_running_mode) and
DaskRunner, the order alternating between rounds. Prints every run with the load, the medians of wall and CPU,
their ratios to each FnApiRunner mode, Dask's wall over the faster mode's, and whether all outputs are
byte-identical. Anything after `--` goes to `pileprep shard`; without it, `--num-shards 4`. The 96 MB figure
in docs/BENCHMARKS.md (train files as --input, the rest absolute, as Dask's workers run in their own folder):

    python bench/dask_bench.py --input 'out/sample-corpus/train/*.jsonl.zst' --tokenizer out/tokenizer/sample-8k.model
    python bench/dask_bench.py --input $C/train/*.jsonl.zst --tokenizer ../shared/data/tokenizers/llama2-bpe-32k.model \
        --repeat 3 -- --val-input $C/val.jsonl.zst --test-input $C/test.jsonl.zst --unit-mb 3 --target-shard-mb 16
"""
from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

REPO = pathlib.Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_WAIT_POLICY="PASSIVE", PYTHONUNBUFFERED="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def _tree_cpu(proc: psutil.Process) -> float:
    """CPU seconds of a process and its live children (finished children are in children_* of the parent)."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + getattr(t, "children_user", 0) + getattr(t, "children_system", 0)
        except psutil.Error:
            pass
    return total


def _digest(root: pathlib.Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "_staging" not in p.parts:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _run(args, out: pathlib.Path, extra: list, cluster_procs=()) -> tuple:
    shutil.rmtree(out, ignore_errors=True)
    before = sum(_tree_cpu(p) for p in cluster_procs)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "shard", "--input", *args.input, "--output",
                             str(out), "--tokenizer", args.tokenizer, "--seq-len", "2048",
                             "--progress-every", "0", *args.shard_args, *extra], env=_env(), cwd=str(REPO),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, err = proc.communicate()
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the driver and every process it waited for
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({extra}):\n{err.decode(errors='replace')[-3000:]}")
    after = sum(_tree_cpu(p) for p in cluster_procs)
    return wall, cpu + (after - before), _digest(out)


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", nargs="+", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1, help="Dask runs before the timed ones (not counted)")
    argv = sys.argv[1:]
    shard_args = argv[argv.index("--") + 1:] if "--" in argv else ["--num-shards", "4"]
    argv = argv[:argv.index("--")] if "--" in argv else argv
    args = ap.parse_args(argv)
    args.shard_args = shard_args
    # Dask workers run in their own folder: relative inputs would not resolve there.
    args.input = [os.path.abspath(p) for p in args.input]
    args.tokenizer = os.path.abspath(args.tokenizer)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="dask-bench-"))
    port = _free_port()
    sched = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                              "--port", str(port), "--no-dashboard"], env=_env(), cwd=tmp,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    worker = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", f"tcp://127.0.0.1:{port}",
                               "--nworkers", str(args.workers), "--nthreads", "1", "--no-dashboard",
                               "--local-directory", str(tmp / "work")], env=_env(), cwd=tmp,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        from distributed import Client

        with Client(f"tcp://127.0.0.1:{port}", timeout=60) as c:
            c.wait_for_workers(args.workers, timeout=120)
        cluster = [psutil.Process(sched.pid), psutil.Process(worker.pid)]
        runs = {
            f"FnApiRunner, {args.workers} threads": ([f"--direct_num_workers={args.workers}",
                                                              "--runner=FnApiRunner",
                                                              "--direct_running_mode=multi_threading"], ()),
            f"FnApiRunner, {args.workers} processes": (["--runner=FnApiRunner", f"--direct_num_workers={args.workers}",
                                                       "--direct_running_mode=multi_processing"], ()),
            f"DaskRunner, {args.workers} worker processes": (["--runner=DaskRunner",
                                                             f"--dask_client_address=tcp://127.0.0.1:{port}"],
                                                            cluster),
        }
        results = {name: [] for name in runs}
        for _ in range(args.warmup):  # the workers' first task imports Beam and pileprep: once per cluster
            r = _run(args, tmp / "out", *runs[names_dask := list(runs)[2]])
            print(f"warm-up {names_dask} (not counted: worker imports): {r[0]:.2f} s wall, {r[1]:.1f} CPU-s, "
                  f"load {_load()}", flush=True)
        for i in range(args.repeat):
            order = list(runs) if i % 2 == 0 else list(reversed(runs))  # alternate, so drift hits each alike
            for name in order:
                extra, procs = runs[name]
                r = _run(args, tmp / "out", extra, procs)
                results[name].append(r)
                print(f"run {i + 1} {name}: {r[0]:.2f} s wall, {r[1]:.1f} CPU-s, load {_load()}", flush=True)
        med = {n: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
               for n, rs in results.items()}
        names = list(runs)
        print(f"\nmedians of {args.repeat} alternating runs each")
        print(f"{'runner':<40}{'wall s':>9}{'CPU s':>9}{'wall / threads':>16}{'wall / procs':>14}"
              f"{'CPU / procs':>13}")
        for n in names:
            print(f"{n:<40}{med[n][0]:>9.2f}{med[n][1]:>9.1f}{med[n][0] / med[names[0]][0]:>16.2f}"
                  f"{med[n][0] / med[names[1]][0]:>14.2f}{med[n][1] / med[names[1]][1]:>13.2f}")
        dk = med[names[2]][0] / min(med[names[0]][0], med[names[1]][0])
        print(f"Dask wall / the faster FnApiRunner mode's wall: {dk:.2f} (target <= 1.3)")
        print("outputs byte-identical:", len({r[2] for rs in results.values() for r in rs}) == 1)
    finally:
        for p in (worker, sched):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
