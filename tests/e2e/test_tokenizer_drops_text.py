"""A tiktoken --tokenizer-pattern that drops text only in some contexts (a lookahead): every code point is matched
somewhere, so the probe (references.TiktokenReference._check_round_trip) passes, but "abcxyz" loses its "a". A real
`pileprep shard` dead-letters each document whose ids do not hold all of its bytes (`tokenizer_drops_text`,
references.TiktokenReference.lost_text), writes the rest, and `verify --inputs` audits the dataset OK (hostile
review rv2, F2)."""
from __future__ import annotations

import glob
import json

import pytest

from tests.corpus_fixtures import pile_line
from tests.ops_fixtures import run_cli
from tests.unit.tokenize.crafted import tiktoken_bytes

pytestmark = pytest.mark.timeout(600)
CONTEXT_DROP = r"(?:(?!abcxyz).)+|\s+"  # at "abcxyz" no alternative matches the "a": tiktoken skips it


def test_a_document_that_loses_text_is_dead_lettered_and_the_rest_written(tmp_path):
    texts = [f"plain document number {i}, nothing odd here\n" for i in range(6)]
    texts.insert(3, "hello abcxyz world, this is the text")
    (tmp_path / "in.jsonl").write_bytes(b"".join(pile_line(t, "Src") for t in texts))
    (tmp_path / "tok.tiktoken").write_bytes(tiktoken_bytes())
    out = tmp_path / "out"
    proc = run_cli(["shard", "--input", str(tmp_path / "in.jsonl"), "--output", str(out), "--tokenizer",
                    str(tmp_path / "tok.tiktoken"), "--tokenizer-pattern", CONTEXT_DROP, "--special-tokens",
                    "<|endoftext|>=300", "--seq-len", "64", "--num-shards", "1", "--val-fraction", "0",
                    "--test-fraction", "0", "-q"], timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["contract"]["version"] == "1.4"
    assert manifest["records"] == {"read": 7, "written": 6, "filtered": {},
                                   "dead_lettered": {"tokenizer_drops_text": 1}}
    rows = [json.loads(line) for f in glob.glob(str(out / "gen-*" / "dead_letter" / "*.jsonl"))
            for line in open(f)]
    assert [(r["file"], r["line"], r["reason"]) for r in rows] == [(str(tmp_path / "in.jsonl"), 4,
                                                                    "tokenizer_drops_text")]
    assert "35 of the text's 36 UTF-8 bytes, the first lost at byte 6" in rows[0]["detail"]
    audit = run_cli(["verify", str(out), "--inputs", str(tmp_path / "in.jsonl")], timeout_s=300)
    assert audit.returncode == 0 and audit.stdout.rstrip().endswith("OK"), audit.stdout + audit.stderr
    assert "6 documents found once and token-exact, 1 dead-lettered" in audit.stdout
