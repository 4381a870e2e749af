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
from typing import Optional

REPO = pathlib.Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

# A tiny model on the fixture data (seq_len 32, vocab 64): seconds per run on one core.
# seq_len (32) and vocab_size (64) come from the dataset's contract.
TINY = ["--n-layers", "3", "--d-model", "32", "--n-heads", "2",
        "--data-streams", "4", "--shuffle-buffer", "16", "--global-batch", "8", "--threads", "1",
        "--warmup-steps", "2", "--lr", "1e-2"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(hooks: Optional[dict] = None) -> dict:
    e = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO),
             PILEPREP_TEST_HOOKS=json.dumps(hooks or {}))
    e.pop("RANK", None)
    e.pop("WORLD_SIZE", None)
    return e


def command(nproc: int, args: list) -> list:
    """torchrun of trainer.train with the test hooks (tests/trainer_entry.py)."""
    return TORCHRUN + ["--nnodes", "1", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
                       "--rdzv-endpoint", f"127.0.0.1:{_port()}", "--max-restarts", "0",
                       "-m", "tests.trainer_entry"] + list(args)


def run_trainer(nproc: int, args: list, timeout: float = 120, check: bool = True,
                hooks: Optional[dict] = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(command(nproc, args), cwd=REPO, env=env(hooks), capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"trainer failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def read_metrics(path) -> list:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def losses(path) -> dict:
    return {r["step"]: r["loss"] for r in read_metrics(path)}


def crash_run(nproc: int, args: list, work_dir, pause_after_step: int, timeout: float = 150) -> None:
    """Run until every rank has finished `pause_after_step`, then SIGKILL every process of the run.

    torchrun starts its workers in their own sessions, so killing torchrun (or its process group) leaves them
    running: each rank writes a pid file, and psutil finds torchrun's descendants too. Returns only when none of
    them is alive.
    """
    import psutil

    pid_dir = os.path.join(str(work_dir), "pids")
    proc = subprocess.Popen(command(nproc, args), cwd=REPO, env=env({"pid_dir": pid_dir,
                            "pause_after_step": pause_after_step}), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list = []
    import threading
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.time() + timeout
    try:
        while time.time() < deadline:
            if any(line.startswith(f"step {pause_after_step:>6}/") for line in lines):  # "step      4/7 | ..."
                time.sleep(0.5)  # the other ranks reach the pause right after rank 0's log line
                break
            if proc.poll() is not None:
                raise AssertionError(f"run ended (rc={proc.returncode}) before step {pause_after_step}:\n"
                                     + "".join(lines[-40:]))
            time.sleep(0.05)
        else:
            raise AssertionError("timed out waiting for the run to reach the kill step:\n" + "".join(lines[-40:]))
    finally:
        victims = {proc.pid}
        try:
            victims |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pass
        if os.path.isdir(pid_dir):
            victims |= {int(open(os.path.join(pid_dir, n)).read()) for n in os.listdir(pid_dir)}
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)
        end = time.time() + 30
        while time.time() < end and any(_alive(pid) for pid in victims):
            time.sleep(0.05)
        assert not [pid for pid in victims if _alive(pid)], "processes of the run survived SIGKILL"
    assert len(os.listdir(pid_dir)) == nproc, "not every rank wrote its pid file"


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent to reap it is dead: it runs no code)."""
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
