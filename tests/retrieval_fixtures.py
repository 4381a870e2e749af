"""Helpers of the retrieval end-to-end tests (tests/e2e/test_retrieval_*.py): a small sharded dataset of the
good corpus, and a byte-for-byte comparison of two output trees."""
from __future__ import annotations

import filecmp
import pathlib

import pytest

from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from tests.corpus_fixtures import write_good_corpus

SEQ_LEN = 128
IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


def small_dataset(tokenizer: str, corpus: pathlib.Path, out: pathlib.Path, limit_bytes: int) -> pathlib.Path:
    """`limit_bytes` of the good corpus in 2 files, sharded at SEQ_LEN into 2 shards with a val split."""
    write_good_corpus(corpus, limit_bytes=limit_bytes, files=2)
    config = ShardConfig(inputs=(str(corpus / "*"),), output=str(out), tokenizer=tokenizer, seq_len=SEQ_LEN,
                         num_shards=2, val_fraction=0.1, test_fraction=0.0, unit_mb=0.05)
    shard_pipeline.run(config, IN_MEMORY)
    return out


def same_tree(a: pathlib.Path, b: pathlib.Path) -> None:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert filecmp.cmp(a / rel, b / rel, shallow=False), f"{rel} differs"


@pytest.fixture(scope="module")
def dask_address():
    """Two worker processes of one thread each on 127.0.0.1, closed at teardown (Beam's DaskRunner would
    otherwise start its own local cluster and never close it). Workers are spawned, so they import pileprep
    from this checkout through the parent's sys.path, as a cluster's workers import it from their image.
    Used by tests/e2e/test_retrieval_dask.py and test_retrieval_ranges_sidecar.py."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        yield cluster.scheduler_address
        # DaskRunner's own Client (the default one) outlives the pipeline; closed before the cluster, or it
        # retries the closed scheduler at exit
        while True:
            try:
                distributed.default_client().close()
            except ValueError:  # no default client left
                break
