"""The manifest's per-backend counts count a long document once, at its whole UTF-8 size, however many ~1 MiB
pieces it was encoded in (transforms/tokenize/tokenizer.py `_encode_long`, spot_check.SpotChecked.count_as_one):
`documents_by_backend` and `spot_checked` add up to the records read and to the texts' bytes, for an HF
tokenizer.json and a SentencePiece model (whose later pieces drop their leading space under the dummy prefix),
with --tokenizer-backend auto (hostile review rv2, F9)."""
from __future__ import annotations

import json

import pytest

from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from tests.conftest import stdlib_texts
from tests.corpus_fixtures import pile_line
from tests.ops_fixtures import FAST_LOCAL
from transforms.tokenize import long_documents

pytestmark = pytest.mark.timeout(900)


def _texts() -> list:
    """A 1.6 Mi-character document (two pieces and a bit; accents, so bytes are not characters) and 12 short ones."""
    words = " ".join(text for _src, text in stdlib_texts(400_000)).split()
    long_text = " ".join(w + ("é" if i % 7 == 0 else "") for i, w in enumerate(words * 40))[:1_650_000].strip()
    assert len(long_text) > long_documents.PIECE_CHARS * 3 // 2
    return [long_text] + [f"short document {i} with some words, café\n" for i in range(12)]


@pytest.mark.parametrize("kind", ["hf-tokenizer-json", "sentencepiece"])
def test_a_long_document_counts_once_at_its_size(kind, hf_bpe, tiny_tokenizer, tmp_path):
    texts = _texts()
    n = len(texts)
    (tmp_path / "in.jsonl").write_bytes(b"".join(pile_line(t, "Src") for t in texts))
    tokenizer = {"hf-tokenizer-json": str(hf_bpe[0]), "sentencepiece": tiny_tokenizer}[kind]
    out = tmp_path / "out"
    cfg = ShardConfig(inputs=(str(tmp_path / "in.jsonl"),), output=str(out), tokenizer=tokenizer, seq_len=2048,
                      num_shards=1, val_fraction=0.0, test_fraction=0.0, tokenizer_backend="auto")
    shard_pipeline.run(cfg, FAST_LOCAL, progress_every_s=0)
    manifest = json.loads((out / "manifest.json").read_text())
    backend = manifest["tokenizer_backend"]
    assert manifest["records"]["read"] == manifest["records"]["written"] == n
    assert backend["name"] == "gigatoken", backend["reason"]  # auto: the fast backend with its counts
    size = sum(len(t.encode("utf-8")) for t in texts)
    by_backend = backend["documents_by_backend"].values()
    assert sum(b["documents"] for b in by_backend) == n
    assert sum(b["bytes"] for b in by_backend) == size
    spot = backend["spot_checked"]
    assert (spot["documents"], spot["bytes"]) == (n, size)
    assert spot["fast_documents"] + spot["reference_documents"] == n
    assert spot["checked_documents"] <= n and spot["checked_bytes"] <= size
