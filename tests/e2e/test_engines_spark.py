"""The shard job on a real Spark standalone cluster (a master and two worker JVMs on 127.0.0.1, executors
starting Python SDK worker processes), through Beam's Spark job server: --near-dedup output byte-identical to
FnApiRunner's, and the S3 secrets among its options nowhere in Spark's event log.

The cluster is started once per session (tests/engines_clusters.py) by the code behind `make spark-cluster`, and
the job gets exactly the BEAM_ARGS that target prints. Fails, never skips, without Java or `make spark`. The
killed-worker and Ctrl-C cases run on Flink (tests/e2e/test_engines_flink.py; the suite has one
killed-worker case; Spark's was measured by hand: docs/OPERATIONS.md).
"""
from __future__ import annotations

import json
import pathlib

import pytest

from tests.engines_clusters import (FAKE_KEY_ID, FAKE_SECRET, SECRET_ARGS, assert_identical,  # noqa: F401
                                    engines_reference, files_holding, run_summary, shard_args, spark_cluster)
from tests.ops_fixtures import dataset_files, run_cli

pytestmark = [pytest.mark.engines, pytest.mark.timeout(420)]


def _executors_launched(cluster) -> set:
    """The workers the master launched executors on, from its log."""
    log = pathlib.Path(cluster.state_dir) / "master.log"
    return {line.rsplit(" on worker ", 1)[1].strip() for line in log.read_text().splitlines()
            if "Launching executor" in line and " on worker " in line}


def test_spark_cluster_near_dedup_output_is_byte_identical_and_keeps_secrets_out_of_spark(
        tmp_path, spark_cluster, engines_reference):
    corpus, reference, tokenizer = engines_reference
    log = tmp_path / "run.jsonl"
    res = run_cli(shard_args(corpus, tmp_path / "spark", tokenizer, "--run-log", str(log), *SECRET_ARGS,
                             *spark_cluster.beam_args), timeout_s=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert_identical(dataset_files(tmp_path / "spark"), reference)
    # It ran on the cluster's two workers, not in a local[*] inside the job server.
    assert len(_executors_launched(spark_cluster)) == 2
    manifest = json.loads((tmp_path / "spark" / "manifest.json").read_text())
    assert run_summary(log)["counters"]["records"] == manifest["records"]["read"]  # reruns not counted twice
    shuffle = [json.loads(line) for line in log.read_text().splitlines() if '"shuffle"' in line]
    assert [e["shuffle"] for e in shuffle if e["event"] == "shuffle"] == ["runner"]  # the engine's own shuffle
    # Spark's event log (what a history server shows) has the job, and no secret; nor do the cluster's logs.
    events = pathlib.Path(spark_cluster.state_dir) / "events"
    assert [p for p in events.iterdir() if p.is_file()], "no Spark event log was written"
    assert files_holding(pathlib.Path(spark_cluster.state_dir), FAKE_SECRET, FAKE_KEY_ID) == []
    assert FAKE_SECRET not in res.stderr and FAKE_KEY_ID not in res.stderr
