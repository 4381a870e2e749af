"""A real `pileprep shard` (a subprocess) refuses a tokenizer file or option that would lose text or have no
effect with exit 2 and exactly one stderr line `pileprep: error: ...`, before it creates the output directory,
its staging area or its lock; a tokenizer with a lossy normalizer runs (with one warning), and `verify --inputs`
round-trips its documents against the normalized text and says so (hostile review of issue 28, F2/F3/F4/F9)."""
from __future__ import annotations

import json
import re

import pytest

from tests.corpus_fixtures import pile_line
from tests.ops_fixtures import run_cli
from tests.unit.tokenize.crafted import added_token, as_bytes, byte_level_spec, tiktoken_bytes

pytestmark = pytest.mark.timeout(600)
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
REMOVED_SPLIT = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": r"\s+"}, "behavior": "Removed", "invert": False}, BYTE_LEVEL]}


def _hf(**fields) -> bytes:
    spec = byte_level_spec([("h", "e")], added=[added_token(257, "<|endoftext|>")])
    spec.update(fields)
    return as_bytes(spec)


@pytest.fixture()
def root(tmp_path):
    (tmp_path / "in.jsonl").write_bytes(b"".join(pile_line(f"The QUICK Brown FOX number {i}\n\nsmile 😀 end", "Src")
                                                 for i in range(12)))
    (tmp_path / "tok.json").write_bytes(_hf())
    (tmp_path / "truncation.json").write_bytes(_hf(truncation={"direction": "Right", "max_length": 4,
                                                               "strategy": "LongestFirst", "stride": 0}))
    (tmp_path / "removed.json").write_bytes(_hf(pre_tokenizer=REMOVED_SPLIT))
    (tmp_path / "no_decoder.json").write_bytes(_hf(decoder=None))
    (tmp_path / "lower.json").write_bytes(_hf(normalizer={"type": "Lowercase"}))
    (tmp_path / "tok.tiktoken").write_bytes(tiktoken_bytes())
    return tmp_path


def _shard(root, tokenizer, *extra):
    out = root / "out"
    return run_cli(["shard", "--input", str(root / "in.jsonl"), "--output", str(out), "--tokenizer",
                    str(root / tokenizer), "--seq-len", "64", "--num-shards", "1", "--val-fraction", "0",
                    "--test-fraction", "0", "--progress-every", "0", *extra], timeout_s=240), out


TIKTOKEN = ("--special-tokens", "<|endoftext|>=300")
REFUSED = [
    ("truncation.json", (), r"truncation = \{.*set it to null"),
    ("removed.json", (), r'pre_tokenizer\.pretokenizers\[0\] is a Split pre-tokenizer with behavior "Removed"'),
    ("no_decoder.json", (), "ByteLevel pre-tokenizer but decoder = null"),
    ("tok.json", ("--special-tokens", "<|x|>=5"), "--special-tokens applies to tiktoken files only"),
    ("tok.json", ("--eos-token", ""), "--eos-token is empty"),
    ("tok.tiktoken", (*TIKTOKEN, "--tokenizer-pattern", "[^\U0001F600]"), r"\(U\+1F600\).*would drop"),
    ("tok.tiktoken", (*TIKTOKEN, "--tokenizer-pattern", r"[\x00-\uffff]+"), r"\(U\+1F600\).*would drop"),
]


@pytest.mark.parametrize("tokenizer, extra, reason", REFUSED, ids=[
    "truncation", "removed-split", "no-decoder", "special-tokens-on-hf", "empty-eos", "astral-one", "bmp-only"])
def test_a_refused_tokenizer_is_exit_2_one_line_and_leaves_nothing(root, tokenizer, extra, reason):
    before = sorted(p.name for p in root.iterdir())
    res, out = _shard(root, tokenizer, *extra)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("pileprep: error: "), res.stderr[-3000:]
    assert re.search(reason, lines[0]), lines[0]
    assert not out.exists() and sorted(p.name for p in root.iterdir()) == before  # no output, staging or lock


def test_a_lowercase_normalizer_runs_warned_and_verify_checks_the_normalized_text(root):
    res, out = _shard(root, "lower.json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr.count("normalizes text (Lowercase)") == 1, res.stderr[-3000:]
    res = run_cli(["verify", str(out), "--inputs", str(root / "in.jsonl")], timeout_s=240)
    assert res.returncode == 0 and res.stdout.rstrip().endswith("OK"), res.stdout + res.stderr[-2000:]
    assert "12 round-tripped; 0 problem(s)" in res.stdout, res.stdout
    assert "note: round trip checked against the text as the tokenizer's normalizer (Lowercase)" in res.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["records"]["written"] == 12
