"""`retrieval build` on DaskRunner (a local cluster of two worker processes): the chunk database's Parquet shards,
manifest and BM25 postings are byte-identical to FnApiRunner's. It failed before in JoinByDocument: Beam's Dask
translation keeps every tagged output of a ParDo in its main bag (pipeline/retrieval/build_read.py, PIECE).

A tiny BM25 database on purpose (the Dask run is most of this module's time)."""
from __future__ import annotations

from pipeline.ops import runners
from pipeline.retrieval import build
from pipeline.retrieval.config import BuildConfig
from tests.retrieval_fixtures import IN_MEMORY, dask_address, same_tree, small_dataset  # noqa: F401 (a fixture)

CHUNK = 32



def test_bm25_build_on_dask_is_byte_identical_to_fnapi(tiny_tokenizer, dask_address, tmp_path):
    dataset = small_dataset(tiny_tokenizer, tmp_path / "corpus", tmp_path / "ds", 12_000)

    def db(name: str, args):
        out = tmp_path / name
        m = build.run(BuildConfig(dataset=str(dataset), output=str(out), chunk_len=CHUNK, num_db_shards=2), args)
        return out, m

    (fnapi, m), (dask, _) = db("fnapi", IN_MEMORY), db("dask", [f"--runner={runners.DASK_RUNNER}",
                                                             f"--dask_client_address={dask_address}"])
    same_tree(fnapi, dask)
    assert sum(s["chunks"] for s in m["shards"]) > 50 and len(list(dask.rglob("bm25-*.npy"))) == 5
