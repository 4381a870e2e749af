"""Dask cluster vs FnApiRunner on the same input: wall time and CPU seconds of every process involved.

Starts a real `dask scheduler` and `dask worker --nworkers N --nthreads 1` on 127.0.0.1 (separate processes),
runs `pileprep shard` once per runner (best of --repeat) and prints wall and CPU as ratios to FnApiRunner with
the same number of worker processes, plus a check that both outputs are byte-identical.

    python bench/dask_bench.py --input 'out/sample-corpus/train/*.jsonl.zst' --tokenizer out/tokenizer/sample-8k.model
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
                             str(out), "--tokenizer", args.tokenizer, "--seq-len", "2048", "--num-shards", "4",
                             "--progress-every", "0", *extra], env=_env(), cwd=str(REPO),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, err = proc.communicate()
    wall = time.monotonic() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the driver and every process it waited for
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({extra}):\n{err.decode(errors='replace')[-3000:]}")
    after = sum(_tree_cpu(p) for p in cluster_procs)
    return wall, cpu + (after - before), _digest(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", nargs="+", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
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
        fn_extra = ["--runner=FnApiRunner", f"--direct_num_workers={args.workers}",
                    "--direct_running_mode=multi_processing"]
        dask_extra = ["--runner=DaskRunner", f"--dask_client_address=tcp://127.0.0.1:{port}"]
        fn = min((_run(args, tmp / "fn", fn_extra) for _ in range(args.repeat)), key=lambda r: r[0])
        dk = min((_run(args, tmp / "dask", dask_extra, cluster) for _ in range(args.repeat)), key=lambda r: r[0])
        print(f"{'runner':<34}{'wall s':>9}{'CPU s':>9}{'wall ratio':>12}{'CPU ratio':>11}")
        print(f"{'FnApiRunner, %d processes' % args.workers:<34}{fn[0]:>9.1f}{fn[1]:>9.1f}{1:>12.2f}{1:>11.2f}")
        print(f"{'DaskRunner, %d worker processes' % args.workers:<34}{dk[0]:>9.1f}{dk[1]:>9.1f}"
              f"{dk[0] / fn[0]:>12.2f}{dk[1] / fn[1]:>11.2f}")
        print("outputs byte-identical:", fn[2] == dk[2])
    finally:
        for p in (worker, sched):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
