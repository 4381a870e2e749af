"""A real `pileprep shard` and `verify --inputs` (subprocesses) on what the second hostile review (rv2) found:
F1/F8, a tokenizer.json with a vocab id past a gap or nested 3000 deep is refused with exit 2 and one line before
any output exists (it crashed the workers / gave exit 1); F4, an add_prefix_space tokenizer's dataset passes its
own audit; F5, a dataset sharded with relative paths is audited from another directory under another spelling
of its input, and its unreadable relative tokenizer path is named as the manifest's."""
from __future__ import annotations

import json

import pytest

from tests.corpus_fixtures import pile_line
from tests.ops_fixtures import run_cli
from tests.unit.tokenize.crafted import added_token, as_bytes, byte_level_spec

pytestmark = pytest.mark.timeout(600)
PREFIX_SPACE = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
BYTE_LEVEL = {**PREFIX_SPACE, "add_prefix_space": False}


def _spec(**fields) -> dict:
    spec = byte_level_spec([("h", "e")], added=[added_token(257, "<|endoftext|>")])
    spec.update(fields)
    return spec


@pytest.fixture()
def root(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "c1.jsonl").write_bytes(b"".join(
        pile_line(f"The QUICK Brown FOX number {i}\n\n  smile \U0001F600 end ", "Src") for i in range(12)))
    gap = _spec()
    gap["model"]["vocab"]["zz"] = 100_000
    (tmp_path / "gap.json").write_bytes(as_bytes(gap))
    deep = '{"type": "Sequence", "pretokenizers": [' * 3000 + json.dumps(BYTE_LEVEL) + "]}" * 3000
    (tmp_path / "deep.json").write_bytes(as_bytes(_spec()).replace(
        b'"pre_tokenizer": {', b'"pre_tokenizer": ' + deep.encode() + b', "x": {', 1))
    (tmp_path / "work" / "tok").mkdir()
    (tmp_path / "work" / "tok" / "prefix.json").write_bytes(as_bytes(_spec(pre_tokenizer=PREFIX_SPACE,
                                                                           decoder=PREFIX_SPACE)))
    return tmp_path


def _shard(tokenizer: str, cwd, out: str = "out"):
    return run_cli(["shard", "--input", "c1.jsonl", "--output", out, "--tokenizer", tokenizer, "--seq-len", "64",
                    "--num-shards", "1", "--val-fraction", "0", "--test-fraction", "0", "--progress-every", "0"],
                   timeout_s=240, cwd=str(cwd))


@pytest.mark.parametrize("name, reason", [("gap.json", "vocab entry 'zz' has id 100000"),
                                          ("deep.json", "nested too deeply")])
def test_a_gapped_or_deep_tokenizer_json_is_exit_2_one_line(root, name, reason):
    res = _shard(str(root / name), root / "work")
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("pileprep: error: "), res.stderr[-3000:]
    assert reason in lines[0] and not (root / "work" / "out").exists(), lines[0]


def test_a_relative_prefix_space_dataset_verifies_from_anywhere(root):
    work = root / "work"
    res = _shard("tok/prefix.json", work)
    assert res.returncode == 0, res.stderr[-3000:]
    # F4: every document decodes to " " + its text; F5: another directory, another spelling of c1.jsonl
    res = run_cli(["verify", "work/out", "--inputs", "work/c*.jsonl", "--tokenizer", "work/tok/prefix.json"],
                  timeout_s=240, cwd=str(root))
    assert res.returncode == 0 and res.stdout.rstrip().endswith("OK"), res.stdout + res.stderr[-2000:]
    assert "12 round-tripped; 0 problem(s)" in res.stdout, res.stdout
    res = run_cli(["verify", "out", "--inputs", str(work / "c1.jsonl")], timeout_s=240, cwd=str(work))
    assert res.returncode == 0 and "12 round-tripped; 0 problem(s)" in res.stdout, res.stdout + res.stderr[-2000:]
    # the manifest's relative tokenizer path, read from another directory: named as the manifest's
    res = run_cli(["verify", "work/out", "--inputs", "work/c1.jsonl"], timeout_s=240, cwd=str(root))
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr[-2000:]
    assert lines[0].startswith("pileprep: error: the manifest's tokenizer (config.tokenizer) cannot be read at "
                               "tok/prefix.json") and "does not record the directory shard ran in" in lines[0]
