"""The shard job on a real Spark standalone cluster (a master and two worker JVMs on 127.0.0.1, executors
starting Python SDK worker processes), through Beam's Spark job server: byte-identical to FnApiRunner, and a
killed SDK worker never changes the committed bytes.

The cluster is started once per session (tests/engine_clusters.py) by the code behind `make spark-cluster`, and
the job gets exactly the BEAM_ARGS that target prints. Fails, never skips, without Java or `make spark`.
"""
from __future__ import annotations

import json
import pathlib

import pytest

from tests.engine_clusters import (assert_failed_then_resumes, assert_identical, spark_cluster,  # noqa: F401
                                   reference_run, run_and_kill_one_sdk_worker, run_summary, shard_args)
from tests.ops_fixtures import dataset_files, run_cli

pytestmark = [pytest.mark.engines, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def corpus_and_reference(tmp_path_factory, tiny_tokenizer):
    corpus, reference = reference_run(tmp_path_factory.mktemp("spark-corpus"), tiny_tokenizer)
    return corpus, reference, tiny_tokenizer


def _executors_launched(cluster) -> set:
    """The workers the master launched executors on, from its log."""
    log = pathlib.Path(cluster.state_dir) / "master.log"
    return {line.rsplit(" on worker ", 1)[1].strip() for line in log.read_text().splitlines()
            if "Launching executor" in line and " on worker " in line}


def test_spark_cluster_near_dedup_output_is_byte_identical_to_fnapirunner(tmp_path, spark_cluster,
                                                                         corpus_and_reference):
    corpus, reference, tokenizer = corpus_and_reference
    log = tmp_path / "run.jsonl"
    res = run_cli(shard_args(corpus, tmp_path / "spark", tokenizer, "--run-log", str(log),
                             *spark_cluster.beam_args), timeout_s=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert_identical(dataset_files(tmp_path / "spark"), reference)
    # It ran on the cluster's two workers, not in a local[*] inside the job server.
    assert len(_executors_launched(spark_cluster)) == 2
    manifest = json.loads((tmp_path / "spark" / "manifest.json").read_text())
    assert run_summary(log)["counters"]["records"] == manifest["records"]["read"]
    shuffle = [json.loads(line) for line in log.read_text().splitlines() if '"shuffle"' in line]
    assert [e["shuffle"] for e in shuffle if e["event"] == "shuffle"] == ["runner"]  # the engine's own shuffle


def test_spark_killed_sdk_worker_leaves_the_uninterrupted_bytes_or_nothing(tmp_path, spark_cluster,
                                                                          corpus_and_reference):
    corpus, reference, tokenizer = corpus_and_reference
    out = tmp_path / "spark-kill"
    res, killed = run_and_kill_one_sdk_worker(spark_cluster, shard_args(corpus, out, tokenizer,
                                                                         *spark_cluster.beam_args), out)
    assert killed is not None, "the job finished before the fault point"
    if res.returncode == 0:  # Spark re-ran the failed task on a fresh SDK worker
        assert_identical(dataset_files(out), reference)
    else:  # the job failed in one line and committed nothing; the rerun resumes to the uninterrupted bytes
        assert_failed_then_resumes(res, out, shard_args(corpus, out, tokenizer, *spark_cluster.beam_args), reference)
    print(f"\nSpark: SDK worker {killed} SIGKILLed during tokenize -> exit {res.returncode}")
