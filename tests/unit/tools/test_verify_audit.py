"""pipeline/tools/verify_audit.py on its own: the seeded sample of input records, how one record reads as a
document, which held-out split an input belongs to, and the refusal naming the manifest's tokenizer (hostile
review rv2, F5; moved from test_rv2_verify.py). The whole audit: tests/integration/tools/test_verify.py."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from pipeline.tools import verify_audit
from pipeline.tools.verify_audit import _manifest_tokenizer_unreadable


@pytest.mark.parametrize("path, tail", [("bpe/tokenizer.json", "does not record the directory shard ran in"),
                                        ("/nowhere/tokenizer.json", "pass --tokenizer")])
def test_an_unreadable_manifest_tokenizer_is_named_as_the_manifests(path, tail):
    message = _manifest_tokenizer_unreadable(path, f"--tokenizer: cannot read the tokenizer file at {path}: missing")
    assert message.startswith(f"the manifest's tokenizer (config.tokenizer) cannot be read at {path}: missing")
    assert "--tokenizer:" not in message and tail in message and os.linesep not in message


def test_the_sample_is_the_same_whatever_the_file_order_and_keeps_n_records(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(b"".join(b'{"text": "a%d"}\n' % i for i in range(20)))
    b.write_bytes(b"".join(b'{"text": "b%d"}\n' % i for i in range(20)))
    one = verify_audit.sample_records([str(a), str(b)], 5, seed=1)
    assert len(one) == 5 and one == sorted(one)
    assert verify_audit.sample_records([str(b), str(a)], 5, seed=1) == one
    assert verify_audit.sample_records([str(a), str(b)], 5, seed=2) != one  # the seed picks another sample
    assert len(verify_audit.sample_records([str(a)], 100, seed=1)) == 20


@pytest.mark.parametrize("data,expected", [
    (b'{"meta": {"body": "hello"}}', ("document", "hello")),
    (b"   ", ("filtered", "blank_line")),
    (b'{"meta": {"body": "  "}}', ("filtered", "empty_text")),
    (b"{not json", ("invalid", "not parseable JSON")),
    (b'{"meta": {"body": 3}}', ("invalid", "no string 'meta.body'")),
    (b'["meta"]', ("invalid", "no string 'meta.body'")),
    (b'{"meta": {"body": "\\ud800"}}', ("invalid", "lone surrogate")),
])
def test_a_record_reads_as_a_document_filtered_or_invalid(data, expected):
    assert verify_audit._document_text(data, "meta.body") == expected


def test_a_held_out_input_is_found_by_glob_or_exact_path():
    manifest = SimpleNamespace(config={"test_inputs": ["in/test-*.jsonl"], "val_inputs": ["in/v[1].jsonl"]})
    assert verify_audit._held_out_split(manifest, "in/test-0.jsonl") == "test"
    assert verify_audit._held_out_split(manifest, "in/v[1].jsonl") == "val"  # the literal path, not the glob
    assert verify_audit._held_out_split(manifest, "in/train.jsonl") is None
