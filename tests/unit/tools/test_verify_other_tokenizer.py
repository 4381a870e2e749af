"""`pileprep verify DIR --inputs ...` with a tokenizer file that is not the one the dataset was built with (its
sha256 is not the contract's), from the manifest or from --tokenizer, is a configuration error: exit 2, one line
naming both sha256s and the way out, never "PROBLEM ... sha256 differs" / FAILED / exit 1 (rv2 review F7).
`inspect` keeps a note and the raw ids, and says why (a viewer: the ids are still the data's)."""
from __future__ import annotations

import hashlib

import pytest

from pipeline.cli import main as cli_main
from tests.unit.tokenize.crafted import added_token, as_bytes, byte_level_spec
from tests.unit.tools.test_inspect_tokenizer_refusals import _dataset, _one_error_line


@pytest.fixture
def other(tmp_path):
    """A usable tokenizer file that is not the contract's (the dataset records sha256 0…0)."""
    path = tmp_path / "other.json"
    path.write_bytes(as_bytes(byte_level_spec(added=[added_token(256, "<|endoftext|>")])))
    (tmp_path / "in.jsonl").write_text('{"text": "hello world"}\n')
    return path


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.timeout(120)
def test_verify_with_the_manifests_other_tokenizer_is_exit_2_naming_both_sha256s(tmp_path, capsys, other):
    ds = _dataset(tmp_path, str(other))
    assert cli_main(["verify", ds, "--inputs", str(tmp_path / "in.jsonl")]) == 2
    line = _one_error_line(capsys)
    assert f"config.tokenizer) {other}: sha256 {_sha(other)[:12]}" in line, line
    assert f"is not the contract's {'0' * 12}" in line and "pass --tokenizer with the file" in line, line


@pytest.mark.timeout(120)
def test_verify_with_another_explicit_tokenizer_is_exit_2(tmp_path, capsys, other):
    ds = _dataset(tmp_path, str(tmp_path / "absent.json"))
    assert cli_main(["verify", ds, "--inputs", str(tmp_path / "in.jsonl"), "--tokenizer", str(other)]) == 2
    line = _one_error_line(capsys)
    assert f"--tokenizer {other}: sha256 {_sha(other)[:12]}" in line and "0" * 12 in line, line


def test_inspect_keeps_the_note_and_says_why(tmp_path, capsys, other):
    ds = _dataset(tmp_path, str(other))
    assert cli_main(["inspect", ds, "--examples", "1"]) == 0
    out = capsys.readouterr().out
    assert "is not the contract's" in out and "the raw ids below are still the data's" in out, out
