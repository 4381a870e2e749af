"""`pileprep retrieval build` then `pileprep retrieval neighbours` (BM25) on the real Spark and Flink clusters
(tests/engines_clusters.py), through the command a user types with the cluster's BEAM_ARGS: the chunk database
(Parquet shards, BM25 postings, manifest) and the neighbour sidecar are byte-identical to FnApiRunner's, as they
are on DaskRunner (tests/e2e/test_retrieval_dask.py). Both jobs go through the job runner's submission
(pipeline/retrieval/store_job.py `execute`: pipeline/ops/engines/submit.py), so the S3 secrets given on the
command line reach no file of the cluster (Spark's event log; its executors' logs, which held them when
store_job submitted the options unfiltered) and no Flink job configuration.

BM25 because its neighbours are byte-identical by construction (a dense sidecar is compared by recall, see
pipeline/retrieval/neighbours.py) and it needs no model on these cores. A tiny dataset on purpose: each engine
job's cost is mostly its start-up; FnApiRunner's reference is made once per module, in process.
"""
from __future__ import annotations

import json
import pathlib
import urllib.request

import pytest

from pipeline.retrieval import build, neighbours
from pipeline.retrieval.config import BuildConfig, NeighboursConfig
from tests.engines_clusters import (FAKE_KEY_ID, FAKE_SECRET, SECRET_ARGS, files_holding)
from tests.ops_fixtures import run_cli
from tests.retrieval_fixtures import IN_MEMORY, same_tree, small_dataset

pytestmark = [pytest.mark.engines, pytest.mark.timeout(420)]

CHUNK = 32
SHARDS = 2
NEIGHBOUR_LEN = 2 * CHUNK


@pytest.fixture(scope="module")
def reference(tiny_tokenizer, tmp_path_factory):
    """A small dataset, and FnApiRunner's BM25 database and sidecar of it (the same settings as `commands`)."""
    root = tmp_path_factory.mktemp("engines-retrieval")
    dataset = small_dataset(tiny_tokenizer, root / "corpus", root / "ds", 12_000)
    db, nb = root / "fnapi-db", root / "fnapi-nb"
    m = build.run(BuildConfig(dataset=str(dataset), output=str(db), chunk_len=CHUNK, num_db_shards=SHARDS),
                  IN_MEMORY)
    side = neighbours.run(NeighboursConfig(dataset=str(dataset), db=str(db), output=str(nb),
                                           neighbour_len=NEIGHBOUR_LEN), IN_MEMORY)
    assert m["counts"]["chunks"] > 50 and side["retrieval"]["counts"]["neighbours"] > 0
    return dataset, db, nb


def commands(dataset: pathlib.Path, out: pathlib.Path, beam_args: list) -> tuple:
    """`pileprep retrieval build` and `neighbours` into OUT/db and OUT/nb with `beam_args`; both must exit 0."""
    db, nb = out / "db", out / "nb"
    for args in (["build", "--dataset", str(dataset), "--output", str(db), "--chunk-len", str(CHUNK),
                  "--num-db-shards", str(SHARDS)],
                 ["neighbours", "--dataset", str(dataset), "--db", str(db), "--output", str(nb),
                  "--neighbour-len", str(NEIGHBOUR_LEN)]):
        res = run_cli(["retrieval", *args, *beam_args], timeout_s=300)
        assert res.returncode == 0, res.stderr[-3000:]
        assert FAKE_SECRET not in res.stderr and FAKE_KEY_ID not in res.stderr
    return db, nb


def test_spark_retrieval_build_and_neighbours_are_byte_identical_and_keep_secrets_out_of_spark(
        tmp_path, spark_cluster, reference):
    dataset, fnapi_db, fnapi_nb = reference
    events = pathlib.Path(spark_cluster.state_dir) / "events"
    before = set(events.iterdir())
    db, nb = commands(dataset, tmp_path, [*SECRET_ARGS, *spark_cluster.beam_args])
    same_tree(fnapi_db, db)
    same_tree(fnapi_nb, nb)
    # One Spark application per job, each on the standalone master (not a local[*] inside the job server), as
    # its event log (a history server's view) records; no secret there nor in the executors' or daemons' logs.
    new = sorted(p for p in events.iterdir() if p not in before)
    assert len(new) == 2, new
    assert all(spark_cluster.master_url in p.read_text(errors="replace") for p in new)
    assert files_holding(pathlib.Path(spark_cluster.state_dir), FAKE_SECRET, FAKE_KEY_ID) == []


def _flink_jobs(cluster) -> dict:
    with urllib.request.urlopen(f"http://{cluster.master_url}/jobs/overview", timeout=5) as r:
        return {j["jid"]: j for j in json.loads(r.read())["jobs"]}


def test_flink_retrieval_build_and_neighbours_are_byte_identical_and_keep_secrets_out_of_flink(
        tmp_path, flink_cluster, reference):
    dataset, fnapi_db, fnapi_nb = reference
    before = _flink_jobs(flink_cluster)
    db, nb = commands(dataset, tmp_path, [*SECRET_ARGS, *flink_cluster.beam_args])
    same_tree(fnapi_db, db)
    same_tree(fnapi_nb, nb)
    # Both ran as jobs of the session cluster's JobManager; their configurations (what the web UI shows) and the
    # cluster's logs hold no secret.
    new = [jid for jid in _flink_jobs(flink_cluster) if jid not in before]
    assert [_flink_jobs(flink_cluster)[jid]["state"] for jid in new] == ["FINISHED", "FINISHED"]
    for jid in new:
        with urllib.request.urlopen(f"http://{flink_cluster.master_url}/jobs/{jid}/config", timeout=5) as r:
            shown = r.read().decode()
        assert FAKE_SECRET not in shown and FAKE_KEY_ID not in shown
    assert files_holding(pathlib.Path(flink_cluster.state_dir), FAKE_SECRET, FAKE_KEY_ID) == []
