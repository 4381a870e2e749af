"""Real corpora from ../shared/data (The Pile, lm_dataformat's naughty strings, arXiv, Dolma, C4) through the
whole shard job with the real Llama 2 tokenizer; where that folder is absent, the same job on the generated stand-ins
with the same names (tests/fixtures/)."""
import collections
import json
import pathlib
import shutil

import numpy as np
import pytest
import sentencepiece as spm

from model_contract import decode_example, read_records
from pipeline.shard import shard_pipeline
from pipeline.config import ShardConfig
from tests.conftest import shared_data
from transforms.shard.documents import Document, parse_record
from transforms.io.read_records import RawRecord, compression_of, iter_raw_records

REAL_FILES = [("pile", "00.jsonl.zst"), ("pile", "val.jsonl.zst"), ("pile", "test.jsonl.zst"),
              ("other", "lm_dataformat-naughty-strings.jsonl.zst"), ("other", "arxiv.jsonl"),
              ("other", "dolma-cc_en_head-0091.jsonl.gz"), ("other", "c4-sample.01.json.gz"),
              ("other", "enron_examples.jsonl")]
SOURCE_FIELDS = ("meta.pile_set_name", "source")


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    tokenizer = str(shared_data("tokenizers", "llama2-bpe-32k.model"))
    corpus = tmp_path_factory.mktemp("real")
    for folder, name in REAL_FILES:
        shutil.copy(shared_data(folder, name), corpus / name)
    out = tmp_path_factory.mktemp("real-out") / "ds"
    config = ShardConfig(inputs=(str(corpus / "*"),), output=str(out), tokenizer=tokenizer, seq_len=1024,
                         num_shards=2, val_fraction=0.0, test_fraction=0.0, source_fields=SOURCE_FIELDS)
    manifest = shard_pipeline.run(config, ["--runner=FnApiRunner", "--direct_num_workers=1",
                                           "--direct_running_mode=in_memory"])
    return corpus, out, manifest, tokenizer


def test_real_files_reconcile_and_keep_sources(real_run):
    corpus, out, manifest, _ = real_run
    per_file = {pathlib.Path(i["path"]).name: i for i in manifest["inputs"]}
    assert set(per_file) == {name for _, name in REAL_FILES}
    for name, info in per_file.items():
        assert info["read"] == info["written"] + sum(info["filtered"].values()) + sum(info["dead_lettered"].values())
        assert info["read"] > 0, name
    assert per_file["arxiv.jsonl"]["written"] == 20
    assert per_file["c4-sample.01.json.gz"]["written"] == 10
    assert {"Pile-CC", "OpenWebText2", "Wikipedia (en)"} <= set(manifest["sources"])
    assert any("common-crawl" in s or "cc" in s.lower() for s in manifest["sources"]), manifest["sources"].keys()


def test_real_documents_round_trip_exactly(real_run):
    corpus, out, manifest, tokenizer = real_run
    sp = spm.SentencePieceProcessor(model_file=tokenizer)
    pieces = collections.defaultdict(list)
    for s in manifest["shards"]:
        for record in read_records(str(out / s["path"])):
            ex = decode_example(record)
            for n, (doc, off) in enumerate(zip(ex["piece_doc_ids"], ex["piece_offsets"]), start=1):
                pieces[int(doc)].append((int(off), ex["input_ids"][ex["segment_ids"] == n]))
    checked = set()
    for path in sorted(corpus.iterdir()):
        with open(path, "rb") as f:
            for item in iter_raw_records(f, compression_of(str(path))):
                doc = parse_record(item.data, source_fields=SOURCE_FIELDS) if isinstance(item, RawRecord) else None
                if isinstance(doc, Document) and doc.doc_id in pieces:
                    got = np.concatenate([p[1] for p in sorted(pieces[doc.doc_id], key=lambda p: p[0])])
                    assert got.tolist() == sp.encode(doc.text) + [sp.eos_id()], (path.name, item.line)
                    checked.add(doc.doc_id)
    assert len(checked) == manifest["records"]["written"]  # the naughty file repeats a document: deduped
    assert manifest["records"]["filtered"].get("duplicate") == 1


def test_naughty_strings_are_handled_not_crashed(real_run):
    _, out, manifest, _ = real_run
    info = next(i for i in manifest["inputs"] if i["path"].endswith("naughty-strings.jsonl.zst"))
    assert info["written"] >= 1
    # its record whose text is a list (the real file's and the stand-in's) is dead-lettered with file, line, reason
    assert manifest["records"]["dead_lettered"].get("text_not_a_string") == 1 and manifest["dead_letters"]
    reasons = set()
    for rel in manifest["dead_letters"]:
        for line in open(out / rel, encoding="utf-8"):
            row = json.loads(line)
            assert {"file", "line", "reason", "excerpt"} <= set(row)
            reasons.add((row["reason"], row["file"].endswith("naughty-strings.jsonl.zst")))
    assert ("text_not_a_string", True) in reasons
