"""`auto` routes each document by the fast backend's proven domain; units of a failed backend are never reused."""
from __future__ import annotations

import json

import pytest

from tests.corpus_fixtures import pile_line, write_good_corpus
from tests.ops_fixtures import FAST_LOCAL, dataset_files, run_cli, subprocess_env
from tests.unit.tokenize import crafted

pytest.importorskip("gigatoken")
EXT_J = "\U000323B0"  # a letter in Unicode 17 (gigatoken), unassigned in Unicode 16 (HF tokenizers)
FAULT = "FAULT-MARKER-7"


@pytest.fixture(scope="module")
def setup(tmp_path_factory, hf_bpe_file):
    root = tmp_path_factory.mktemp("in")
    write_good_corpus(root, limit_bytes=60_000, files=2)
    odd = [f"Doc {i}: the {EXT_J}'s letter and ab{EXT_J}'s again.\n" for i in range(8)]
    (root / "odd.jsonl").write_bytes(b"".join(pile_line(t, "Odd") for t in odd))
    (root / "zz-fault.jsonl").write_bytes(pile_line(f"The last file holds {FAULT} in plain text.", "Fault"))
    return root, hf_bpe_file


@pytest.fixture(scope="module")
def hf_bpe_file(tmp_path_factory):
    from pipeline.tools.sample_corpus import write_sample_corpus
    from pipeline.tools.tokenizer_train import train_hf_bpe

    corpus = tmp_path_factory.mktemp("corpus")
    write_sample_corpus(str(corpus), target_mb=1)
    out = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    train_hf_bpe([f"{corpus}/train/*.jsonl.zst"], str(out), 700, max_sentences=600, max_sentence_chars=1024)
    spec = crafted.with_apostrophe_s(json.loads(out.read_bytes()))  # `'s` merged: a split beside `'` changes ids
    out.write_text(json.dumps(spec))
    return out


def _shard(root, tok, out, backend, cache, fault=""):
    env = subprocess_env(PILEPREP_TOKENIZER_CACHE=str(cache), PILEPREP_TEST_BACKEND_FAULT=fault)
    return run_cli(["shard", "--input", f"{root}/*", "--output", str(out), "--tokenizer", str(tok),
                    "--seq-len", "128", "--num-shards", "2", "--tokenizer-backend", backend, *FAST_LOCAL],
                   timeout_s=400, env=env)


def test_auto_routes_by_domain_and_shards_equal_reference(setup, tmp_path):
    root, tok = setup
    cache = tmp_path / "cache"
    ref, auto = tmp_path / "ref", tmp_path / "auto"
    for out, backend in ((ref, "reference"), (auto, "auto")):
        proc = _shard(root, tok, out, backend, cache)
        assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((auto / "manifest.json").read_bytes())
    section = manifest["tokenizer_backend"]
    assert section["name"] == "gigatoken"
    by = section["documents_by_backend"]
    assert by["tokenizers"]["documents"] >= 8  # the Unicode 17 documents, at least
    assert by["gigatoken"]["documents"] > 0
    checked = section["spot_checked"]
    assert by["gigatoken"]["documents"] + by["tokenizers"]["documents"] == checked["documents"]
    assert by["gigatoken"]["bytes"] + by["tokenizers"]["bytes"] == checked["bytes"]
    assert checked["documents"] == manifest["records"]["read"] - sum(manifest["records"]["dead_lettered"].values())
    a, r = dataset_files(auto), dataset_files(ref)
    shards = [k for k in r if k.endswith(".tfrecord")]
    assert shards and all(a[k] == r[k] for k in shards)


def test_failed_backend_units_are_not_reused(setup, tmp_path):
    root, tok = setup
    cache, out, clean = tmp_path / "cache", tmp_path / "out", tmp_path / "clean"
    failed = _shard(root, tok, out, "auto", cache, fault=FAULT)
    assert failed.returncode != 0
    assert "--tokenizer-backend reference" in failed.stderr
    # the rerun the message names: every unit the failed backend finished is discarded, none reused
    proc = _shard(root, tok, out, "reference", cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "made by tokenizer backend 'gigatoken=" in proc.stderr, proc.stderr[-3000:]
    assert json.loads((out / "manifest.json").read_bytes())["tokenizer_backend"]["name"] == "tokenizers"
    proc = _shard(root, tok, clean, "reference", cache)
    assert proc.returncode == 0
    got, want = dataset_files(out), dataset_files(clean)
    shards = [k for k in want if k.endswith(".tfrecord")]
    assert shards and all(got[k] == want[k] for k in shards)
