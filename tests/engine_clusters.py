"""Session-wide Spark and Flink clusters for tests/e2e/test_spark_runner.py and test_flink_runner.py.

Each is started once per test session (JVM start-up is seconds) by the same code as `make spark-cluster` /
`make flink-cluster` (pipeline/ops/engines/cluster.py), from the engines `make test` fetched (`make engines`, via
test-deps). Where Java or the engines are missing these fixtures fail, never skip: CI has Java 17 and Maven.
The cluster processes import pileprep from this checkout (PYTHONPATH), as a real cluster's nodes have it installed.
"""
from __future__ import annotations

import json
import pathlib
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


def _start(engine: str, tmp_path_factory) -> engine_cluster.Cluster:
    try:
        fetch.require(engine)
    except fetch.EngineSetupError as e:
        pytest.fail(f"{e} (make test runs `make engines` first; these tests never skip)")
    state = tmp_path_factory.mktemp(f"{engine}-cluster")
    starter = engine_cluster.start_spark if engine == "spark" else engine_cluster.start_flink
    return starter(state, env=subprocess_env(PYTHONPATH=str(REPO)))


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    c = _start("spark", tmp_path_factory)
    try:
        yield c
    finally:
        engine_cluster.stop(pathlib.Path(c.state_dir))


@pytest.fixture(scope="session")
def flink_cluster(tmp_path_factory):
    c = _start("flink", tmp_path_factory)
    try:
        yield c
    finally:
        engine_cluster.stop(pathlib.Path(c.state_dir))


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


def run_and_kill_one_sdk_worker(c, args: list, out: pathlib.Path, timeout_s: float = 240):
    """Run `pileprep ARGS` on cluster `c`; at the first tokenized unit's progress marker (the tokenize stage is
    running) SIGKILL one Python SDK worker process. Returns (CompletedProcess, killed pid or None)."""
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=str(REPO), env=subprocess_env(PYTHONPATH=str(REPO)),
                            start_new_session=True)
    killed = None
    try:
        deadline = time.monotonic() + timeout_s
        while killed is None and time.monotonic() < deadline and proc.poll() is None:
            if any((out / "_staging").glob("*.progress/unit-*.json")):
                workers = sdk_workers(c)
                if workers:
                    killed = workers[0].pid
                    workers[0].kill()
                    break
            time.sleep(0.05)
        stdout, stderr = proc.communicate(timeout=max(10.0, deadline - time.monotonic()))
    except BaseException:
        kill_group(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout.decode(errors="replace"),
                                       stderr.decode(errors="replace")), killed


def assert_failed_then_resumes(res, out: pathlib.Path, args: list, reference: dict) -> None:
    """A failed cluster run: its last line is pileprep's one-line failure, nothing is committed, and running the
    same command again (resuming the finished units the failed attempt kept) commits the reference's bytes: a
    unit the killed attempt half-wrote never reaches a shard."""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith(("WARNING", "20"))]
    assert lines and lines[-1].startswith("pileprep: failed:"), res.stderr[-3000:]
    assert not (out / "manifest.json").exists()
    again = run_cli(args, timeout_s=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert_identical(dataset_files(out), reference)
