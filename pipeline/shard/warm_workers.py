"""Beam SDK worker processes started at the top of `pileprep shard`, before the driver imports Beam and plans.

FnApiRunner starts its worker processes (multi_processing) when the pipeline runs, after the driver's ~1.3 s of
importing Beam and pileprep and planning on one core; each worker then spends ~0.75 s importing the same
(bench/profile_shard.py: the first stage, 0.7-0.8 s with both cores busy, before any record is read). Started
first, the workers import on the core the driver leaves idle, and when the runner starts a worker it is handed
one of them: the runner's environment for it (control and logging addresses, pipeline options) goes down the
process's stdin, and the process runs Beam's own worker main with it (pipeline/shard/warm_worker.py).

Only where the run will use FnApiRunner's worker processes on this machine (`expected_workers`: the mode
given, or the default from the inputs' size as pipeline/beam_glue.py default_running_mode decides it), never
for a dry run or an incremental run. A process not handed to the runner is killed when the command ends
(`discard`): its cost is its imports (~0.75 CPU-s), on a core the driver did not use.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from typing import Optional

SDK_WORKER_MAIN = "apache_beam.runners.worker.sdk_worker_main"
_POOL: list = []
_HANDED = [0]


def local_raw_bytes(patterns) -> Optional[int]:
    """The raw bytes the inputs are expected to give (pipeline/shard/unit_plan.py raw_bytes_estimate), from the
    local files the patterns match; None when one is not local (the plan lists those through Beam)."""
    from pipeline.shard.unit_plan import raw_bytes_estimate  # noqa: PLC0415 - Beam-free

    total = 0
    for pattern in patterns:
        if "://" in pattern:
            return None
        for path in glob.glob(pattern) if glob.has_magic(pattern) else [pattern]:
            if os.path.isfile(path):
                total += raw_bytes_estimate(path, os.path.getsize(path))
    return total


def expected_workers(config, beam_args) -> int:
    """How many FnApiRunner worker processes this run will start: 0 unless it is sure to use them. Without
    --runner the job gets one worker per core in the mode default_running_mode picks from the inputs' size
    (pipeline/beam_glue.py chosen_running_mode applies it again after planning); FnApiRunner named without
    --direct_num_workers has Beam's one worker."""
    from pipeline.ops import runners  # noqa: PLC0415 - Beam-free

    runner = runners.arg_value(beam_args, "--runner")
    if runner is not None and runner.rsplit(".", 1)[-1] != "FnApiRunner":
        return 0
    workers = runners.arg_value(beam_args, "--direct_num_workers")
    cores = len(os.sched_getaffinity(0))
    n = int(workers) if workers and workers.isdigit() else (cores if runner is None else 1)
    mode = runners.arg_value(beam_args, "--direct_running_mode")
    if mode is None and runner is None:
        raw = local_raw_bytes([*config.inputs, *config.val_inputs, *config.test_inputs])
        mode = runners.default_running_mode(cores, raw or 0)  # a remote input: threads on <= 4 cores
    return n if mode == "multi_processing" and n > 1 else 0


def start(n: int) -> None:
    """Start `n` warm worker processes (their malloc settings as the runner's own workers get them), then have
    the runner hand them out (`install`, which imports Beam here: after the processes started)."""
    from transforms.io import memory  # noqa: PLC0415

    if n <= 0:
        return
    memory.configure_child_processes()
    for _ in range(n):
        _POOL.append(subprocess.Popen([sys.executable, "-m", "pipeline.shard.warm_worker"], stdin=subprocess.PIPE))
    install()


def take(env: dict) -> Optional[subprocess.Popen]:
    """A started worker process, given `env` to run Beam's worker main with; None when none is left."""
    while _POOL:
        proc = _POOL.pop(0)
        if proc.poll() is not None:
            continue
        try:
            proc.stdin.write(json.dumps(dict(env)).encode("utf-8") + b"\n")
            proc.stdin.close()
        except OSError:  # it died meanwhile
            proc.kill()
            proc.wait()
            continue
        _HANDED[0] += 1
        return proc
    return None


def waiting() -> int:
    """Started processes not handed to the runner (yet)."""
    return len(_POOL)


def handed() -> int:
    """Processes handed to the runner so far in this process."""
    return _HANDED[0]


def discard() -> None:
    """Kill every process not handed to the runner (a run that ended early or used fewer workers)."""
    while _POOL:
        proc = _POOL.pop()
        proc.kill()
        proc.wait()
        if proc.stdin:
            proc.stdin.close()


class _Subprocess:
    """What local_job_service sees as its `subprocess` module: its worker command gets a warm process."""

    def __getattr__(self, name):
        return getattr(subprocess, name)

    def Popen(self, args, *rest, **kw):  # noqa: N802 - the name Beam calls
        if isinstance(args, str) and SDK_WORKER_MAIN in args and kw.get("env") is not None:
            proc = take(kw["env"])
            if proc is not None:
                return proc
        return subprocess.Popen(args, *rest, **kw)


def install() -> None:
    """Hand warm processes to FnApiRunner's subprocess workers (idempotent; no effect with none started)."""
    from apache_beam.runners.portability import local_job_service  # noqa: PLC0415

    if not isinstance(local_job_service.subprocess, _Subprocess):
        local_job_service.subprocess = _Subprocess()
