"""Parquet input through the whole shard job: rows become documents like JSON lines do (the unit tests of
transforms/io/read_parquet.py are tests/unit/io/test_parquet.py)."""
from __future__ import annotations

import json

import pyarrow as pa
import sentencepiece as spm

from model_contract import decode_example, read_records
from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from tests.unit.io.test_parquet import _texts, _write

IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


def test_shard_job_reads_parquet_end_to_end(tiny_tokenizer, tmp_path):
    texts = _texts(300_000)
    root = tmp_path / "in"
    root.mkdir()
    half = len(texts) // 2
    _write(root / "part-0.parquet", pa.table({"content": texts[:half], "source": ["web"] * half}), 64)
    rest = texts[half:] + [None]
    _write(root / "part-1.parquet", pa.table({"content": rest, "source": ["books"] * len(rest)}), 64)
    (root / "notes.txt").write_text("not matched by the glob")
    config = ShardConfig(inputs=(str(root / "*.parquet"),), output=str(tmp_path / "out"), tokenizer=tiny_tokenizer,
                         seq_len=128, num_shards=2, text_field="content", source_fields=("source",),
                         val_fraction=0.0, test_fraction=0.0)
    manifest = shard_pipeline.run(config, IN_MEMORY, progress_every_s=0)
    rec = manifest["records"]
    assert rec["read"] == len(texts) + 1 and rec["dead_lettered"] == {"text_null": 1}
    assert rec["written"] + rec["filtered"].get("duplicate", 0) == len(texts)
    assert set(manifest["sources"]) == {"web", "books"}
    dead = [json.loads(line) for d in manifest["dead_letters"] for line in open(tmp_path / "out" / d)]
    assert dead == [{"file": str(root / "part-1.parquet"), "line": len(rest), "reason": "text_null", "excerpt": "",
                     "detail": f"row group {(len(rest) - 1) // 64}, row {(len(rest) - 1) % 64}"}]
    sp = spm.SentencePieceProcessor(model_file=tiny_tokenizer)
    expected = sum(len(ids) + 1 for ids in sp.encode(sorted(set(texts))))
    got = sum(int((decode_example(r)["segment_ids"] > 0).sum()) for s in manifest["shards"]
              for r in read_records(str(tmp_path / "out" / s["path"])))
    assert got == expected
