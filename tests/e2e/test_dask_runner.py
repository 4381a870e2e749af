"""The shard job on a real Dask cluster (Beam's DaskRunner), byte-identical to FnApiRunner.

One cluster per module: `dask scheduler` and `dask worker --nworkers 2 --nthreads 1` as separate processes
on 127.0.0.1, each in its own session, killed by process group at teardown. Every job runs in a subprocess
under a hard timeout. The workers import pileprep from this checkout (PYTHONPATH), as a cluster's workers
import it from their image.
"""
from __future__ import annotations

import json
import pathlib
import sys
import time

import psutil
import pytest

from tests.conftest import REPO
from tests.corpus_fixtures import write_good_corpus
from tests.ops_fixtures import Service, dataset_files, free_port, kill_group, run_cli, subprocess_env

pytestmark = pytest.mark.timeout(300)
DASK = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
WORKER = [sys.executable, "-m", "distributed.cli.dask_worker"]


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    logs = tmp_path_factory.mktemp("dask")
    port = free_port()
    env = subprocess_env(PYTHONPATH=str(REPO))
    scheduler = Service([*DASK, "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                        logs / "scheduler.log", env=env, cwd=str(logs))
    worker = None
    try:
        scheduler.wait_port(port)
        address = f"tcp://127.0.0.1:{port}"
        worker = Service([*WORKER, address, "--nworkers", "2", "--nthreads", "1", "--host", "127.0.0.1",
                          "--no-dashboard", "--local-directory", str(logs / "work")],
                         logs / "worker.log", env=env, cwd=str(logs))
        _wait_for_workers(address, 2, worker)
        yield {"address": address, "worker": worker, "logs": logs}
    finally:
        if worker is not None:
            worker.stop()
        scheduler.stop()


def _wait_for_workers(address: str, n: int, worker: Service, timeout_s: float = 90) -> None:
    from distributed import Client

    deadline = time.monotonic() + timeout_s
    with Client(address, timeout=30) as client:
        while len(client.scheduler_info()["workers"]) < n:
            if worker.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("dask workers did not register: " + worker.log_path.read_text()[-2000:])
            time.sleep(0.5)


def _args(corpus, output, tokenizer, *extra):
    return ["shard", "--input", str(corpus / "*"), "--output", str(output), "--tokenizer", tokenizer,
            "--seq-len", "256", "--num-shards", "2", "--val-fraction", "0.2", "--test-fraction", "0.1",
            "--unit-mb", "0.25", "--progress-every", "0", *extra]


def _dask(cluster, *extra):
    return ["--runner=DaskRunner", f"--dask_client_address={cluster['address']}", *extra]


@pytest.fixture(scope="module")
def corpus_and_reference(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("dask-corpus")
    write_good_corpus(root / "in", limit_bytes=1_200_000)
    res = run_cli(_args(root / "in", root / "fnapi", tiny_tokenizer), timeout_s=150)
    assert res.returncode == 0, res.stderr[-3000:]
    return root / "in", dataset_files(root / "fnapi"), tiny_tokenizer


def _run_log_summary(path: pathlib.Path) -> dict:
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return next(e for e in events if e["event"] == "summary")


def test_dask_output_is_byte_identical_and_every_stage_ran_once(tmp_path, dask_cluster, corpus_and_reference):
    corpus, reference, tokenizer = corpus_and_reference
    log = tmp_path / "run.jsonl"
    res = run_cli(_args(corpus, tmp_path / "dask", tokenizer, "--run-log", str(log), *_dask(dask_cluster)),
                  timeout_s=200)
    assert res.returncode == 0, res.stderr[-3000:]
    got = dataset_files(tmp_path / "dask")
    assert got.keys() == reference.keys()
    assert [k for k in got if got[k] != reference[k]] == []
    # Progress markers are written once per unit of work; a stage that ran twice (a side input rebuilt by
    # recomputing Tokenize, say) leaves rerun markers and inflates nothing else: there must be none.
    summary = _run_log_summary(log)
    manifest = json.loads(got["manifest.json"])
    assert summary["counters"].get("stage_reruns", 0) == 0
    assert summary["counters"]["records"] == manifest["records"]["read"]


def test_dask_fuses_split_and_tokenize_when_whole_files_balance_with_identical_output(tmp_path, dask_cluster,
                                                                                    tiny_tokenizer):
    # 8 files on the cluster's 2 worker threads: the graph without SpreadChunks (shard_pipeline.
    # spread_chunks_needed asks the scheduler for its threads); the module's corpus (4 files) keeps the spread.
    write_good_corpus(tmp_path / "in", limit_bytes=400_000, files=8)
    ref = run_cli(_args(tmp_path / "in", tmp_path / "fnapi", tiny_tokenizer), timeout_s=150)
    assert ref.returncode == 0, ref.stderr[-3000:]
    log = tmp_path / "run.jsonl"
    res = run_cli(_args(tmp_path / "in", tmp_path / "dask", tiny_tokenizer, "--run-log", str(log),
                        *_dask(dask_cluster)), timeout_s=200)
    assert res.returncode == 0, res.stderr[-3000:]
    shape = [json.loads(line) for line in log.read_text().splitlines() if '"shuffle"' in line]
    assert [e["spread_chunks"] for e in shape if e["event"] == "shuffle"] == [False]
    got, reference = dataset_files(tmp_path / "dask"), dataset_files(tmp_path / "fnapi")
    assert got.keys() == reference.keys()
    assert [k for k in got if got[k] != reference[k]] == []


def test_dask_short_runner_name_needs_a_reachable_scheduler(tmp_path, corpus_and_reference):
    corpus, _reference, tokenizer = corpus_and_reference
    closed = free_port()
    res = run_cli(_args(corpus, tmp_path / "o", tokenizer, "--runner=DaskRunner",
                        f"--dask_client_address=tcp://127.0.0.1:{closed}"), timeout_s=60)
    assert res.returncode == 2
    assert "--dask_client_address" in res.stderr and "scheduler" in res.stderr
    assert not (tmp_path / "o" / "manifest.json").exists()


def _worker_processes(service: Service) -> list:
    """The worker processes under `dask worker --nworkers 2`: children of the CLI process that hosts the
    nannies (a nanny restarts its worker when it dies; killing the worker, not the nanny, is the fault)."""
    return [c for c in psutil.Process(service.proc.pid).children(recursive=False)
            if any("spawn_main" in part for part in c.cmdline())]


def test_killed_worker_is_recovered_with_identical_output(tmp_path, dask_cluster, corpus_and_reference):
    corpus, reference, tokenizer = corpus_and_reference
    out = tmp_path / "dask-kill"
    log = tmp_path / "run.jsonl"
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli",
                             *_args(corpus, out, tokenizer, "--run-log", str(log), *_dask(dask_cluster))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(REPO),
                            env=subprocess_env(PYTHONPATH=str(REPO)), start_new_session=True)
    killed = None
    try:
        # The deterministic fault point: the first tokenized unit's progress marker appears in staging.
        markers = out / "_staging"
        deadline = time.monotonic() + 150
        while killed is None and time.monotonic() < deadline and proc.poll() is None:
            if any(markers.glob("*.progress/unit-*.json")):
                workers = _worker_processes(dask_cluster["worker"])
                assert len(workers) == 2, [w.cmdline() for w in workers]
                killed = workers[0].pid
                workers[0].kill()
                break
            time.sleep(0.05)
        stdout, stderr = proc.communicate(timeout=200)
    finally:
        kill_group(proc)
    assert killed is not None, "the job finished before the fault point"
    _wait_for_workers(dask_cluster["address"], 2, dask_cluster["worker"])  # the nanny restarted it
    assert proc.returncode == 0, stderr.decode(errors="replace")[-3000:]
    got = dataset_files(out)
    assert got.keys() == reference.keys()
    assert [k for k in got if got[k] != reference[k]] == []
    summary = _run_log_summary(log)
    print(f"\nworker {killed} killed at the first unit marker; the scheduler recomputed lost work: "
          f"{summary['counters'].get('stage_reruns', 0)} stage reruns; output identical to FnApiRunner")


def test_dask_runner_shuffle_is_byte_identical(tmp_path, dask_cluster, corpus_and_reference):
    """`--shuffle files` on Dask writes the bytes of `auto` there (pieces through Dask's GroupByKey,
    the other tests) and of FnApiRunner's file spill (the reference)."""
    corpus, reference, tokenizer = corpus_and_reference
    res = run_cli(_args(corpus, tmp_path / "dask", tokenizer, "--shuffle", "files", *_dask(dask_cluster)),
                  timeout_s=200)
    assert res.returncode == 0, res.stderr[-3000:]
    got = dataset_files(tmp_path / "dask")
    assert got.keys() == reference.keys()
    assert [k for k in got if got[k] != reference[k]] == []
