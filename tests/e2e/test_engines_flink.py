"""The shard job on a real Flink session cluster (a JobManager and a TaskManager JVM on 127.0.0.1, the TaskManager
starting Python SDK worker processes), through Beam's Flink job server: --near-dedup output byte-identical to
FnApiRunner's with no S3 secret in Flink's job configuration; a killed SDK worker's tasks are restarted and the
committed bytes are the uninterrupted run's; Ctrl-C cancels the job on the cluster and releases the output's lock.

The cluster is started once per session (tests/engines_clusters.py) by the code behind `make flink-cluster`, and
the job gets exactly the BEAM_ARGS that target prints. Fails, never skips, without Java or `make flink`.
"""
from __future__ import annotations

import json
import pathlib
import time
import urllib.request

import pytest

from tests.engines_clusters import (FAKE_KEY_ID, FAKE_SECRET, SECRET_ARGS, assert_identical, ctrl_c, files_holding,
                                    kill_one_sdk_worker, run_summary, run_with_fault, shard_args)
from tests.ops_fixtures import dataset_files, run_cli

pytestmark = [pytest.mark.engines, pytest.mark.timeout(420)]


def _rest(cluster, path: str):
    with urllib.request.urlopen(f"http://{cluster.master_url}{path}", timeout=5) as r:
        return json.loads(r.read())


def _jobs(cluster) -> dict:
    return {j["jid"]: j for j in _rest(cluster, "/jobs/overview")["jobs"]}


def test_flink_cluster_near_dedup_output_is_byte_identical_and_keeps_secrets_out_of_flink(
        tmp_path, flink_cluster, engines_reference):
    corpus, reference, tokenizer = engines_reference
    before = _jobs(flink_cluster)
    log = tmp_path / "run.jsonl"
    res = run_cli(shard_args(corpus, tmp_path / "flink", tokenizer, "--run-log", str(log), *SECRET_ARGS,
                             *flink_cluster.beam_args), timeout_s=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert_identical(dataset_files(tmp_path / "flink"), reference)
    # It ran as a job of the session cluster's JobManager, not in an embedded mini-cluster of the job server.
    new = {jid: j for jid, j in _jobs(flink_cluster).items() if jid not in before}
    assert [j["state"] for j in new.values()] == ["FINISHED"]
    manifest = json.loads((tmp_path / "flink" / "manifest.json").read_text())
    assert run_summary(log)["counters"]["records"] == manifest["records"]["read"]
    shuffle = [json.loads(line) for line in log.read_text().splitlines() if '"shuffle"' in line]
    assert [e["shuffle"] for e in shuffle if e["event"] == "shuffle"] == ["runner"]  # the engine's own shuffle
    # What Flink's REST API and web UI show of the job (its configuration holds the pipeline options), and the
    # cluster's logs: no secret.
    jid = next(iter(new))
    shown = json.dumps([_rest(flink_cluster, f"/jobs/{jid}"), _rest(flink_cluster, f"/jobs/{jid}/config")])
    assert "externalizedCheckpointsEnabled" in shown  # the job's pipeline options are what the config shows
    assert FAKE_SECRET not in shown and FAKE_KEY_ID not in shown
    assert files_holding(pathlib.Path(flink_cluster.state_dir), FAKE_SECRET, FAKE_KEY_ID) == []
    assert FAKE_SECRET not in res.stderr and FAKE_KEY_ID not in res.stderr
    # The TaskManager the job ran on: a task heap that holds the runner shuffle's pieces, and an out-of-memory
    # error that ends it instead of being logged while the job hangs (pipeline/ops/engines/cluster.py FLINK_CONF).
    (tm,) = _rest(flink_cluster, "/taskmanagers")["taskmanagers"]
    assert tm["memoryConfiguration"]["taskHeap"] >= 512 << 20, tm["memoryConfiguration"]
    conf = {c["key"]: c["value"] for c in _rest(flink_cluster, "/jobmanager/config")}
    assert (conf.get("cluster.uncaught-exception-handling"), conf.get("taskmanager.jvm-exit-on-oom")) == ("FAIL", "true")


def test_flink_killed_sdk_worker_is_retried_and_the_output_is_the_uninterrupted_bytes(tmp_path, flink_cluster,
                                                                                      engines_reference):
    """The cluster restarts failed tasks (make flink-cluster's restart strategy, as docs/OPERATIONS.md advises):
    the re-executed bundles find the killed attempt's staging files, and none of them reaches a shard."""
    corpus, reference, tokenizer = engines_reference
    before = _jobs(flink_cluster)
    out = tmp_path / "flink-kill"
    res, killed = run_with_fault(shard_args(corpus, out, tokenizer, *flink_cluster.beam_args), out,
                                 kill_one_sdk_worker(flink_cluster))
    assert killed is not None, "the job finished before the fault point"
    assert res.returncode == 0, res.stderr[-3000:]
    assert_identical(dataset_files(out), reference)
    jid = next(jid for jid in _jobs(flink_cluster) if jid not in before)
    failures = _rest(flink_cluster, f"/jobs/{jid}/exceptions")
    assert failures.get("exceptionHistory", {}).get("entries"), failures  # a task failed and was restarted
    print(f"\nFlink: SDK worker {killed} SIGKILLed during tokenize -> restarted, exit 0, identical bytes")


def test_flink_ctrl_c_cancels_the_job_on_the_cluster_and_releases_the_lock(tmp_path, flink_cluster,
                                                                           engines_reference):
    corpus, _reference, tokenizer = engines_reference
    before = _jobs(flink_cluster)
    out = tmp_path / "flink-int"
    res, pid = run_with_fault(shard_args(corpus, out, tokenizer, *flink_cluster.beam_args), out, ctrl_c)
    assert pid is not None, "the job finished before the fault point"
    assert res.returncode == 130, res.stderr[-3000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("pileprep:")]
    assert len(lines) == 1 and lines[0].startswith("pileprep: interrupted; previous dataset intact"), res.stderr[-2000:]
    assert not (out / ".pileprep.lock").exists() and not (out / "manifest.json").exists()
    # On the cluster the job is cancelled, not left running with nobody to collect it.
    deadline = time.monotonic() + 30
    while True:
        new = [j["state"] for jid, j in _jobs(flink_cluster).items() if jid not in before]
        if new and all(s in ("CANCELED", "FAILED", "FINISHED") for s in new) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert new == ["CANCELED"]
