"""The shard job on a real Flink session cluster (a JobManager and a TaskManager JVM on 127.0.0.1, the TaskManager
starting Python SDK worker processes), through Beam's Flink job server: byte-identical to FnApiRunner, and a
killed SDK worker never changes the committed bytes.

The cluster is started once per session (tests/engine_clusters.py) by the code behind `make flink-cluster`, and
the job gets exactly the BEAM_ARGS that target prints. Fails, never skips, without Java or `make flink`.
"""
from __future__ import annotations

import json
import urllib.request

import pytest

from tests.engine_clusters import (assert_failed_then_resumes, assert_identical, flink_cluster,  # noqa: F401
                                   reference_run, run_and_kill_one_sdk_worker, run_summary, shard_args)
from tests.ops_fixtures import dataset_files, run_cli

pytestmark = [pytest.mark.engines, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def corpus_and_reference(tmp_path_factory, tiny_tokenizer):
    corpus, reference = reference_run(tmp_path_factory.mktemp("flink-corpus"), tiny_tokenizer)
    return corpus, reference, tiny_tokenizer


def _overview(cluster) -> dict:
    with urllib.request.urlopen(f"http://{cluster.master_url}/overview", timeout=5) as r:
        return json.loads(r.read())


def test_flink_cluster_near_dedup_output_is_byte_identical_to_fnapirunner(tmp_path, flink_cluster,
                                                                         corpus_and_reference):
    corpus, reference, tokenizer = corpus_and_reference
    finished = _overview(flink_cluster)["jobs-finished"]
    log = tmp_path / "run.jsonl"
    res = run_cli(shard_args(corpus, tmp_path / "flink", tokenizer, "--run-log", str(log),
                             *flink_cluster.beam_args), timeout_s=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert_identical(dataset_files(tmp_path / "flink"), reference)
    # It ran as a job of the session cluster's JobManager, not in an embedded mini-cluster of the job server.
    assert _overview(flink_cluster)["jobs-finished"] == finished + 1
    manifest = json.loads((tmp_path / "flink" / "manifest.json").read_text())
    assert run_summary(log)["counters"]["records"] == manifest["records"]["read"]
    shuffle = [json.loads(line) for line in log.read_text().splitlines() if '"shuffle"' in line]
    assert [e["shuffle"] for e in shuffle if e["event"] == "shuffle"] == ["runner"]  # the engine's own shuffle


def test_flink_killed_sdk_worker_leaves_the_uninterrupted_bytes_or_nothing(tmp_path, flink_cluster,
                                                                          corpus_and_reference):
    corpus, reference, tokenizer = corpus_and_reference
    out = tmp_path / "flink-kill"
    res, killed = run_and_kill_one_sdk_worker(flink_cluster, shard_args(corpus, out, tokenizer,
                                                                         *flink_cluster.beam_args), out)
    assert killed is not None, "the job finished before the fault point"
    if res.returncode == 0:  # Flink restarted the failed tasks on a fresh SDK worker
        assert_identical(dataset_files(out), reference)
    else:  # the job failed in one line and committed nothing; the rerun resumes to the uninterrupted bytes
        assert_failed_then_resumes(res, out, shard_args(corpus, out, tokenizer, *flink_cluster.beam_args), reference)
    print(f"\nFlink: SDK worker {killed} SIGKILLed during tokenize -> exit {res.returncode}")
