"""--decontaminate's evaluation files are checked before any input is read (pipeline/shard/preflight.py
check_decontaminate): a directory, a file that is not JSON lines, a field no record has, a FIFO or a misnamed
compression is exit 2 with one line naming the file, where the stage used to fail in a worker after every
document was tokenized (exit 1) or remove nothing at all."""
from __future__ import annotations

import gzip
import json
import os

import pytest

from pipeline.config import ShardConfig
from pipeline.errors import ConfigError
from pipeline.shard import preflight
from tests.corpus_fixtures import pile_line
from tests.ops_fixtures import run_cli

pytestmark = pytest.mark.timeout(300)


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


@pytest.fixture()
def root(tmp_path):
    (tmp_path / "in.jsonl").write_bytes(b"".join(pile_line(f"document number {i} " * 20, "Src") for i in range(20)))
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "good.jsonl").write_text(json.dumps({"question": {"text": "what is " * 20}}) + "\n")
    return tmp_path


def _shard(root, tokenizer, *extra):
    out = root / "out"
    res = run_cli(["shard", "--input", str(root / "in.jsonl"), "--output", str(out), "--tokenizer", tokenizer,
                   "--seq-len", "64", "--num-shards", "1", "--near-dedup", "--progress-every", "0", *extra],
                  timeout_s=240)
    return res, out


def test_a_directory_is_refused_up_front(root, tiny_tokenizer):
    res, out = _shard(root, tiny_tokenizer, "--decontaminate", str(root / "evals"))
    line = _one_line(res.stderr)
    assert res.returncode == 2 and str(root / "evals") in line and "is a directory" in line, res.stderr
    assert not (out / "manifest.json").exists()


def test_a_file_that_is_not_json_is_refused_up_front(root, tiny_tokenizer):
    bad = root / "evals" / "notes.jsonl"
    bad.write_text('{"question": {"text": "fine"}}\nthis line is prose, not JSON\n')
    res, out = _shard(root, tiny_tokenizer, "--decontaminate", str(root / "evals" / "*.jsonl"),
                      "--decontaminate-field", "question.text")
    line = _one_line(res.stderr)
    assert res.returncode == 2 and str(bad) in line and "not JSON" in line, res.stderr
    assert not (out / "manifest.json").exists()


def _config(root, *patterns, field="question.text") -> ShardConfig:
    return ShardConfig(inputs=(str(root / "in.jsonl"),), output=str(root / "out"), tokenizer="unused.model",
                       near_dedup=True, decontaminate=tuple(str(p) for p in patterns), decontaminate_field=field)


def test_each_bad_evaluation_file_is_a_config_error(root):
    evals = root / "evals"
    preflight.check_decontaminate(_config(root, evals / "good.jsonl"))  # the good one passes
    preflight.check_decontaminate(_config(root, field="no.such.field"))  # off: nothing read

    with pytest.raises(ConfigError, match=r"has no record with a string field 'text'"):
        preflight.check_decontaminate(_config(root, evals / "good.jsonl", field="text"))  # the wrong field
    with pytest.raises(ConfigError, match="matches no file"):
        preflight.check_decontaminate(_config(root, evals / "missing-*.jsonl"))
    os.mkfifo(evals / "pipe.jsonl")
    with pytest.raises(ConfigError, match=r"pipe\.jsonl is not a regular file"):  # never opened: no hang
        preflight.check_decontaminate(_config(root, evals / "*.jsonl"))
    os.unlink(evals / "pipe.jsonl")
    (evals / "really-gzip.jsonl.zst").write_bytes(gzip.compress(b'{"question": {"text": "x"}}\n'))
    with pytest.raises(ConfigError, match="really-gzip"):
        preflight.check_decontaminate(_config(root, evals / "*"))
    os.unlink(evals / "really-gzip.jsonl.zst")
    (evals / "list.jsonl").write_text('["a JSON list", "is not a record"]\n{"question": {"text": "fine"}}\n')
    preflight.check_decontaminate(_config(root, evals / "*.jsonl"))  # records without the field are skipped
