"""The shard job on a real Spark standalone cluster (a master and two worker JVMs on 127.0.0.1, executors
starting Python SDK worker processes), through Beam's Spark job server: reading and writing s3:// on the local
S3-compatible server with --near-dedup, objects byte-identical to FnApiRunner's and the credentials in use
nowhere in Spark's event log; a killed SDK worker's tasks are retried elsewhere, its executor replaced, and the
committed bytes are the uninterrupted run's.

The cluster is started once per session (tests/engines_clusters.py) by the code behind `make spark-cluster`, and
the job gets exactly the BEAM_ARGS that target prints. Fails, never skips, without Java or `make spark`.
"""
from __future__ import annotations

import json
import pathlib

import pytest

from tests.engines_clusters import (FAKE_KEY_ID, FAKE_SECRET, SECRET_ARGS, assert_identical, files_holding,
                                    kill_one_sdk_worker, run_summary, run_with_fault, shard_args)
from tests.ops_fixtures import dataset_files, run_cli, s3_server, subprocess_env  # noqa: F401
from tests.conftest import REPO

pytestmark = [pytest.mark.engines, pytest.mark.timeout(420)]

# No credentials but the options: not the environment's, not a profile (the workers must get them from the job).
NO_AMBIENT_AWS = dict(AWS_ACCESS_KEY_ID=None, AWS_SECRET_ACCESS_KEY=None, AWS_SESSION_TOKEN=None, AWS_PROFILE=None,
                      AWS_ENDPOINT_URL=None, AWS_ENDPOINT_URL_S3=None, AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
                      AWS_CONFIG_FILE="/nonexistent")


def _master_log(cluster) -> list:
    return (pathlib.Path(cluster.state_dir) / "master.log").read_text().splitlines()


def _executors_launched(lines: list) -> set:
    """The workers the master launched executors on, from its log lines."""
    return {line.rsplit(" on worker ", 1)[1].strip() for line in lines
            if "Launching executor" in line and " on worker " in line}


def _s3_objects(client, bucket: str, prefix: str) -> dict:
    """Key below `prefix` -> bytes of every object under it (staging excluded, as dataset_files does)."""
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", [])]
    return {k[len(prefix):]: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in sorted(keys)
            if "/_staging/" not in f"/{k}"}


def _on_s3(args: list, input_glob: str, output: str) -> list:
    args = list(args)
    args[args.index("--input") + 1] = input_glob
    args[args.index("--output") + 1] = output
    return args


def _named_as(objects: dict, generation: str, inputs: str, reference: dict) -> dict:
    """`objects` (a dataset read from S3) under the reference's names: its generation (a fingerprint of the input
    paths: pipeline/shard/plan.py generation_name) and, in the manifests, its input paths renamed; every other
    byte is left as it is."""
    ref_manifest = json.loads(reference["manifest.json"])
    ref_generation, ref_inputs = ref_manifest["generation"], ref_manifest["config"]["inputs"][0].rsplit("/", 1)[0]
    out = {}
    for key, body in objects.items():
        key, body = key.replace(generation, ref_generation), body.replace(generation.encode(), ref_generation.encode())
        if key.endswith("manifest.json"):
            body = body.replace(inputs.encode(), ref_inputs.encode())
        out[key] = body
    return out


def _without_object_facts(manifest: bytes) -> dict:
    """A manifest less what depends on the input's location, not its bytes: the ledger's ETag and mtime, and the
    tokenizer's parity sample, a seeded choice by path (pipeline/shard/plan.py _parity_sample)."""
    m = json.loads(manifest)
    m["ledger"] = [{k: v for k, v in e.items() if k not in ("etag", "mtime")} for e in m["ledger"]]
    for k in ("parity_documents", "parity_tokens", "parity_ids_sha256"):
        m["tokenizer_backend"].pop(k, None)
    return m


def test_spark_cluster_s3_near_dedup_output_is_byte_identical_and_keeps_credentials_out_of_spark(
        tmp_path, spark_cluster, engines_reference, s3_server):
    """One run proves both: the job reads its input from and commits to s3:// on moto (127.0.0.1), with the
    credentials given only as options (no AWS_* variable, profile or file), so the executors' SDK workers reached
    S3 with the credentials the job carries (pipeline/beam_glue.py FilesystemOptions), and those same
    credentials, in use, are then looked for in everything Spark keeps. The reference is the session's local
    FnApiRunner dataset: the objects are its bytes under the names that say where the input lives (an FnApiRunner
    run of the same s3:// input, byte-identical to Spark's, costs this suite minutes of moto requests)."""
    corpus, reference, tokenizer = engines_reference
    client = s3_server.client(FAKE_KEY_ID, FAKE_SECRET)
    for bucket in ("spark-in", "spark-out"):
        client.create_bucket(Bucket=bucket)
    for p in sorted(corpus.iterdir()):
        client.upload_file(str(p), "spark-in", f"corpus/{p.name}")
    log = tmp_path / "run.jsonl"
    before = len(_master_log(spark_cluster))
    args = _on_s3(shard_args(corpus, tmp_path / "unused", tokenizer, "--run-log", str(log), *SECRET_ARGS,
                             *s3_server.beam_args(), *spark_cluster.beam_args),
                  "s3://spark-in/corpus/*", "s3://spark-out/ds")
    res = run_cli(args, timeout_s=300, env=subprocess_env(PYTHONPATH=str(REPO), **NO_AMBIENT_AWS))
    assert res.returncode == 0, res.stderr[-3000:]
    got = _s3_objects(client, "spark-out", "ds/")
    manifest = json.loads(got["manifest.json"])
    assert [e["path"] for e in manifest["ledger"]] == [f"s3://spark-in/corpus/{p.name}"
                                                       for p in sorted(corpus.iterdir())]
    named = _named_as(got, manifest["generation"], "s3://spark-in/corpus", reference)
    manifests = [k for k in named if k.endswith("manifest.json")]
    assert [_without_object_facts(named[k]) for k in manifests] == [_without_object_facts(reference[k])
                                                                     for k in manifests]
    assert_identical({k: v for k, v in named.items() if k not in manifests},
                     {k: v for k, v in reference.items() if k not in manifests})
    assert named.keys() == reference.keys()
    # It ran on the cluster's two workers, not in a local[*] inside the job server.
    assert len(_executors_launched(_master_log(spark_cluster)[before:])) == 2
    assert run_summary(log)["counters"]["records"] == manifest["records"]["read"]  # reruns not counted twice
    shuffle = [json.loads(line) for line in log.read_text().splitlines() if '"shuffle"' in line]
    assert [e["shuffle"] for e in shuffle if e["event"] == "shuffle"] == ["runner"]  # the engine's own shuffle
    # Spark's event log (what a history server shows) has the job, and no credential; nor do the cluster's logs
    # and executors' work directories.
    events = pathlib.Path(spark_cluster.state_dir) / "events"
    assert [p for p in events.iterdir() if p.is_file()], "no Spark event log was written"
    assert files_holding(pathlib.Path(spark_cluster.state_dir), FAKE_SECRET, FAKE_KEY_ID) == []
    assert FAKE_SECRET not in res.stderr and FAKE_KEY_ID not in res.stderr


def test_spark_killed_sdk_worker_is_retried_on_a_fresh_executor_and_the_output_is_the_uninterrupted_bytes(
        tmp_path, spark_cluster, engines_reference):
    """Without make spark-cluster's spark.excludeOnFailure settings the job fails (exit 1, "Task ... failed 4
    times": every retry met the executor's dead SDK worker, pipeline/ops/engines/cluster.py). With them the failed
    task runs again on the other executor, the master replaces the excluded one, and the re-executed bundles find
    the killed attempt's staging files: the dataset (shards and the manifest with its per-shard document counts)
    is the uninterrupted run's, so no unit reached a shard twice, and the run log's record count is the
    manifest's."""
    corpus, reference, tokenizer = engines_reference
    out, log = tmp_path / "spark-kill", tmp_path / "kill.jsonl"
    before = len(_master_log(spark_cluster))
    res, killed = run_with_fault(shard_args(corpus, out, tokenizer, "--run-log", str(log), *spark_cluster.beam_args),
                                 out, kill_one_sdk_worker(spark_cluster))
    assert killed is not None, "the job finished before the fault point"
    assert res.returncode == 0, res.stderr[-3000:]
    assert_identical(dataset_files(out), reference)
    manifest = json.loads((out / "manifest.json").read_text())
    assert run_summary(log)["counters"]["records"] == manifest["records"]["read"]
    # The executor whose SDK worker died was excluded and killed, and a fresh one started in its place.
    lines = _master_log(spark_cluster)[before:]
    kill = next((i for i, ln in enumerate(lines) if "requests to kill executors" in ln), None)
    assert kill is not None, lines[-20:]
    assert any("Launching executor" in ln for ln in lines[kill:]), lines[-20:]
    print(f"\nSpark: SDK worker {killed} SIGKILLed during tokenize -> executor replaced, exit 0, identical bytes")
