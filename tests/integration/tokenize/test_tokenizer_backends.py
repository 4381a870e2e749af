"""The shard job's output is byte-identical whichever exact tokenizer backend ran (the backends themselves:
tests/unit/tokenize/test_tokenizer_backends.py)."""
from __future__ import annotations

import json

from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from tests.conftest import shared_data
from tests.corpus_fixtures import write_good_corpus
from tests.ops_fixtures import FAST_LOCAL, dataset_files
from tests.unit.tokenize.test_tokenizer_backends import LLAMA2
from transforms.tokenize import tokenizer_backends as tb


def test_shards_are_byte_identical_across_backends(tmp_path):
    """Only the manifest's record of which backend ran may differ."""
    tokenizer = str(shared_data(*LLAMA2))
    docs = write_good_corpus(tmp_path / "in", limit_bytes=400_000, files=2)
    texts = [t for t, _source in docs] + [docs[0][0]]  # + the duplicate, tokenized before dedup drops it
    outs = {}
    for backend in ("sentencepiece", "kitoken", "splintr", "gigatoken"):
        cfg = ShardConfig(inputs=(str(tmp_path / "in" / "*"),), output=str(tmp_path / backend), tokenizer=tokenizer,
                          seq_len=256, num_shards=2, tokenizer_backend=backend)
        shard_pipeline.run(cfg, FAST_LOCAL, progress_every_s=0)
        outs[backend] = dataset_files(tmp_path / backend)
    a = outs["sentencepiece"]
    ma = json.loads(a["manifest.json"])
    assert ma.pop("tokenizer_backend")["name"] == "sentencepiece"
    for backend in ("kitoken", "splintr", "gigatoken"):
        b = outs[backend]
        assert a.keys() == b.keys()
        manifests = {"manifest.json", f"generations/{ma['generation']}.manifest.json"}  # the live one and its copy
        assert a["manifest.json"] == a[f"generations/{ma['generation']}.manifest.json"]
        assert [k for k in a if k not in manifests and a[k] != b[k]] == []
        mb = json.loads(b["manifest.json"])
        ran = mb.pop("tokenizer_backend")
        assert ran["name"] == backend and ran["parity_documents"] > 0 and ran["spot_check_every"] > 0
        spot = ran["spot_checked"]  # what share the workers re-encoded with SentencePiece, measured
        rec = ma["records"]
        before_dedup = {k: v for k, v in rec["filtered"].items() if k != "duplicate"}  # dedup runs after tokenizing
        assert spot["documents"] == rec["read"] - sum(before_dedup.values()) - sum(rec["dead_lettered"].values())
        assert spot["checked_documents"] < spot["documents"] and spot["checked_bytes"] < spot["bytes"]
        every = ran["spot_check_every"]  # the documents checked are chosen by a hash of their text
        chosen = [t.encode() for t in texts if tb.spot_check_key(t) % every == 0]
        assert (spot["checked_documents"], spot["checked_bytes"]) == (len(chosen), sum(map(len, chosen)))
        assert spot["document_share"] == round(spot["checked_documents"] / spot["documents"], 6)
        assert ma == mb
