"""Helpers for the trainer tests: run `torchrun -m trainer.train` for real (gloo, CPU) with a timeout."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

# A tiny model on the fixture data (seq_len 32, vocab 64): seconds per run on one core.
TINY = ["--seq-len", "32", "--vocab-size", "64", "--n-layers", "3", "--d-model", "32", "--n-heads", "2",
        "--data-streams", "4", "--shuffle-buffer", "16", "--global-batch", "8", "--threads", "1",
        "--warmup-steps", "2", "--lr", "1e-2"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    e = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    e.pop("RANK", None)
    e.pop("WORLD_SIZE", None)
    return e


def command(nproc: int, args: list) -> list:
    return TORCHRUN + ["--nnodes", "1", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
                       "--rdzv-endpoint", f"127.0.0.1:{_port()}", "--max-restarts", "0",
                       "-m", "trainer.train"] + list(args)


def run_trainer(nproc: int, args: list, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(command(nproc, args), cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"trainer failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def read_metrics(path) -> list:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def losses(path) -> dict:
    return {r["step"]: r["loss"] for r in read_metrics(path)}


def run_and_kill_after(nproc: int, args: list, metrics_file, kill_after_step: int, timeout: float = 120) -> None:
    """Start a run and SIGKILL its whole process group once `kill_after_step` appears in the metrics file."""
    proc = subprocess.Popen(command(nproc, args), cwd=REPO, env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            if os.path.exists(metrics_file) and any(s >= kill_after_step for s in losses(metrics_file)):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                return
            if proc.poll() is not None:
                raise AssertionError(f"run ended (rc={proc.returncode}) before step {kill_after_step}")
            time.sleep(0.05)
        raise AssertionError("timed out waiting for the run to reach the kill step")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
