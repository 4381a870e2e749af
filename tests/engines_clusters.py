"""Session-wide Spark and Flink clusters (and one FnApiRunner reference) for tests/e2e/test_engines_spark.py and
tests/e2e/test_engines_flink.py.

Each is started once per test session (JVM start-up is seconds) by the same code as `make spark-cluster` /
`make flink-cluster` (pipeline/ops/engines/cluster.py), from the engines `make test` fetched (`make engines`, via
test-deps). Where Java or the engines are missing these fixtures fail, never skip: CI has Java 17 and Maven.
The cluster processes import pileprep from this checkout (PYTHONPATH), as a real cluster's nodes have it installed.
"""
from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import psutil
import pytest

from pipeline.ops.engines import cluster as engine_cluster
from pipeline.ops.engines import fetch
from tests.conftest import REPO
from tests.corpus_fixtures import write_good_corpus
from tests.ops_fixtures import dataset_files, kill_group, run_cli, subprocess_env


def _running(engine: str, tmp_path_factory):
    """Start `engine`'s cluster once for the session and stop what was started after it."""
    try:
        fetch.require(engine)
    except fetch.EngineSetupError as e:
        pytest.fail(f"{e} (make test runs `make engines` first; these tests never skip)")
    state = tmp_path_factory.mktemp(f"{engine}-cluster")
    starter = engine_cluster.start_spark if engine == "spark" else engine_cluster.start_flink
    c = starter(state, env=subprocess_env(PYTHONPATH=str(REPO)))
    try:
        yield c
    finally:
        engine_cluster.stop(pathlib.Path(c.state_dir))


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    yield from _running("spark", tmp_path_factory)


@pytest.fixture(scope="session")
def flink_cluster(tmp_path_factory):
    yield from _running("flink", tmp_path_factory)


@pytest.fixture(scope="session")
def engines_reference(tmp_path_factory, tiny_tokenizer):
    """The corpus, FnApiRunner's --near-dedup dataset of it and the tokenizer: once for both engines."""
    corpus, reference = reference_run(tmp_path_factory.mktemp("engines-corpus"), tiny_tokenizer)
    return corpus, reference, tiny_tokenizer


# Options that carry S3 secrets, given to the byte-identity runs (their input and output are local: unused there)
# to prove they never reach an engine's UI, job configuration or event log (pipeline/ops/engines/submit.py).
FAKE_KEY_ID = "PILEPREPFAKEKEYID31"
FAKE_SECRET = "pileprep-fake-secret-0b5e31"
SECRET_ARGS = [f"--s3_access_key_id={FAKE_KEY_ID}", f"--s3_secret_access_key={FAKE_SECRET}",
               f"--s3_session_token={FAKE_SECRET}-token"]


def files_holding(root: pathlib.Path, *needles: str) -> list:
    """The files under `root` (recursively) whose bytes contain any of `needles`."""
    return sorted(str(p) for p in root.rglob("*") if p.is_file()
                  and any(n.encode() in p.read_bytes() for n in needles))


def sdk_workers(c: engine_cluster.Cluster) -> list:
    """The Python SDK worker processes the cluster's executors / TaskManager started (descendants running
    sdk_worker_main), as psutil processes."""
    out = []
    for p in c.processes:
        try:
            for child in psutil.Process(p["pid"]).children(recursive=True):
                try:
                    if any("sdk_worker_main" in part for part in child.cmdline()):
                        out.append(child)
                except psutil.Error:
                    continue
        except psutil.Error:
            continue
    return out


# ------------------------------------------------------------------------------------- the shared cases


def shard_args(corpus, output, tokenizer, *extra) -> list:
    return ["shard", "--input", str(corpus / "*"), "--output", str(output), "--tokenizer", tokenizer,
            "--seq-len", "256", "--num-shards", "2", "--val-fraction", "0.2", "--test-fraction", "0.1",
            "--unit-mb", "0.25", "--progress-every", "0", "--near-dedup", *extra]


def reference_run(root: pathlib.Path, tokenizer: str):
    """A small corpus (4 files, one exact duplicate) and FnApiRunner's dataset of it with --near-dedup."""
    write_good_corpus(root / "in", limit_bytes=600_000)
    res = run_cli(shard_args(root / "in", root / "fnapi", tokenizer), timeout_s=150)
    assert res.returncode == 0, res.stderr[-3000:]
    return root / "in", dataset_files(root / "fnapi")


def assert_identical(got: dict, reference: dict) -> None:
    assert got.keys() == reference.keys()
    assert [k for k in got if got[k] != reference[k]] == []


def run_summary(log: pathlib.Path) -> dict:
    events = [json.loads(line) for line in log.read_text().splitlines()]
    return next(e for e in events if e["event"] == "summary")


def run_with_fault(args: list, out: pathlib.Path, fault, timeout_s: float = 240):
    """Run `pileprep ARGS` in its own process group; once the first tokenized unit's progress marker exists (the
    tokenize stage is running) call `fault(proc)` until it returns something. Returns (CompletedProcess, what
    `fault` returned or None when the job ended first)."""
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=str(REPO), env=subprocess_env(PYTHONPATH=str(REPO)),
                            start_new_session=True)
    done = None
    try:
        deadline = time.monotonic() + timeout_s
        while done is None and time.monotonic() < deadline and proc.poll() is None:
            if any((out / "_staging").glob("*.progress/unit-*.json")):
                done = fault(proc)
            time.sleep(0.05)
        stdout, stderr = proc.communicate(timeout=max(10.0, deadline - time.monotonic()))
    except BaseException:
        kill_group(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout.decode(errors="replace"),
                                       stderr.decode(errors="replace")), done


def kill_one_sdk_worker(c: engine_cluster.Cluster):
    """A `fault`: SIGKILL one Python SDK worker process of the cluster; its pid (None while there is none)."""
    def fault(_proc):
        workers = sdk_workers(c)
        if not workers:
            return None
        workers[0].kill()
        return workers[0].pid
    return fault


def ctrl_c(proc) -> int:
    """A `fault`: SIGINT to the run's whole process group, as a terminal's Ctrl-C (the job-server JVM Beam
    started is in it, unless it detached itself)."""
    os.killpg(proc.pid, signal.SIGINT)
    return proc.pid
