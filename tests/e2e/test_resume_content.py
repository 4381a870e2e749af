"""Resume checks the content of an input (its full sha256, pipeline/shard/input_digests.py), not its path, size
and mtime: a file rewritten in place with the same size and mtime between a failed run and its rerun has its
finished work redone, the other files' work is still reused, and the dataset (and the ledger's sha256) is the
one a fresh build of the new bytes gives."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from tests.corpus_fixtures import good_documents, pile_line
from tests.ops_fixtures import FAST_LOCAL, dataset_files
from transforms.io import io_utils


def _corpus(root, files):
    root.mkdir()
    docs = good_documents(240_000)
    for i in range(files):
        (root / f"part-{i}.jsonl").write_bytes(b"".join(pile_line(t, s) for t, s in docs[i::files]))
    return root


def _config(corpus, out, tokenizer) -> ShardConfig:
    return ShardConfig(inputs=(str(corpus / "*"),), output=str(out), tokenizer=tokenizer, seq_len=128, num_shards=1,
                       val_fraction=0.0, test_fraction=0.0, unit_mb=0.02)


def _rewrite_same_size_same_mtime(path):
    """Change one byte inside a document's text (a letter for another), keeping the size and the mtime."""
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    at = data.index(b'"text": "') + 20
    while not chr(data[at]).isalpha():
        at += 1
    data[at] = ord("Q") if data[at] != ord("Q") else ord("Z")
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


def _events(log, kind):
    return [e for e in map(json.loads, log.read_text().splitlines()) if e.get("event") == kind]


# 3 files on one worker: chunks go through staging (split, then tokenize); 4: each file is tokenized as it is
# cut (pipeline/shard/graph.py spread_chunks_needed)
@pytest.mark.parametrize("files", [3, 4], ids=["spread", "fused"])
def test_an_input_rewritten_with_the_same_size_and_mtime_is_read_again_on_resume(tmp_path, tiny_tokenizer,
                                                                                monkeypatch, files):
    corpus = _corpus(tmp_path / "corpus", files)
    out, log = tmp_path / "out", tmp_path / "run.jsonl"
    # A run that fails with ENOSPC half-way keeps its finished work for the next run (pipeline/shard/resume.py)
    monkeypatch.setenv(io_utils.FAULT_ENOSPC_ENV, "300000")
    monkeypatch.setattr(io_utils, "_fault_written", [0])
    with pytest.raises(Exception, match="[Nn]o space"):
        shard_pipeline.run(_config(corpus, out, tiny_tokenizer), FAST_LOCAL, run_log=str(log), progress_every_s=0)
    monkeypatch.delenv(io_utils.FAULT_ENOSPC_ENV)
    done = sorted(p.name for p in out.glob("_staging/gen-*/done/*.json"))
    assert any("-f000000" in n for n in done) and any("-f000001" in n for n in done), done  # a real midpoint

    _rewrite_same_size_same_mtime(corpus / "part-0.jsonl")
    manifest = shard_pipeline.run(_config(corpus, out, tiny_tokenizer), FAST_LOCAL, run_log=str(log),
                                  progress_every_s=0)
    resume_event = _events(log, "resume")[-1]
    assert any("part-0.jsonl changed since an earlier run read it" in n for n in resume_event["notes"])
    # the other files' finished work is still reused
    assert resume_event["units_reusable"] + resume_event["splits_reusable"] > 0, resume_event
    want_sha = hashlib.sha256((corpus / "part-0.jsonl").read_bytes()).hexdigest()
    assert {r["path"].rsplit("/", 1)[-1]: r["sha256"] for r in manifest["ledger"]}["part-0.jsonl"] == want_sha

    fresh = tmp_path / "fresh"
    shard_pipeline.run(_config(corpus, fresh, tiny_tokenizer), FAST_LOCAL, progress_every_s=0)
    got, want = dataset_files(out), dataset_files(fresh)
    assert got.keys() == want.keys() and [k for k in got if got[k] != want[k]] == []


def test_a_committed_input_rewritten_with_the_same_size_and_mtime_is_rebuilt_not_nothing_to_do(tmp_path,
                                                                                              tiny_tokenizer):
    """The generation's name comes from (path, size) pairs: a plain rerun used to say "nothing to do" over an
    input whose bytes changed in place. The committed ledger's sha256 decides (pipeline/shard/integrity.py)."""
    corpus = _corpus(tmp_path / "corpus", 2)
    out = tmp_path / "out"
    first = shard_pipeline.run(_config(corpus, out, tiny_tokenizer), FAST_LOCAL, progress_every_s=0)
    again = shard_pipeline.run(_config(corpus, out, tiny_tokenizer), FAST_LOCAL, progress_every_s=0)
    assert again["generation"] == first["generation"]  # unchanged bytes: nothing to do, as before

    _rewrite_same_size_same_mtime(corpus / "part-1.jsonl")
    manifest = shard_pipeline.run(_config(corpus, out, tiny_tokenizer), FAST_LOCAL, progress_every_s=0)
    assert manifest["generation"] != first["generation"]
    want_sha = hashlib.sha256((corpus / "part-1.jsonl").read_bytes()).hexdigest()
    assert {r["path"].rsplit("/", 1)[-1]: r["sha256"] for r in manifest["ledger"]}["part-1.jsonl"] == want_sha
    fresh = shard_pipeline.run(_config(corpus, tmp_path / "fresh", tiny_tokenizer), FAST_LOCAL, progress_every_s=0)
    assert [s["sha256"] for s in manifest["shards"]] == [s["sha256"] for s in fresh["shards"]]
    assert [s["sha256"] for s in manifest["shards"]] != [s["sha256"] for s in first["shards"]]
