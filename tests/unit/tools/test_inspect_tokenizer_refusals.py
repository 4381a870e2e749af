"""`pileprep inspect DIR` whose manifest names a tokenizer that is there but is no usable tokenizer (a device, a
FIFO, a file the validator refuses) exits 2 with one line giving the validator's reason, as `verify --inputs`
does; a tokenizer that is absent (the dataset inspected away from where it was built) or another file (its
sha256 is not the contract's) still only gives a note and the ids (hostile review of issue 28, F7)."""
from __future__ import annotations

import dataclasses
import hashlib
import os

import pytest

from pipeline.cli import main as cli_main
from tests.unit.tokenize.crafted import added_token, as_bytes, byte_level_spec


def _dataset(tmp_path, tokenizer_path: str, sha256: str = "0" * 64) -> str:
    """A small committed dataset whose manifest records `tokenizer_path` and a contract sha256 of `sha256`."""
    from model_contract import load_manifest
    from tests.trainer_fixtures import write_dataset

    ds = write_dataset(str(tmp_path / "ds"), n_docs=20, n_shards=1)
    m = load_manifest(ds)
    info = dataclasses.replace(m.contract.tokenizer, model_sha256=sha256)
    totals = {k: sum(getattr(s, k) for s in m.shards) for k in ("examples", "documents", "tokens", "padding_tokens")}
    m = dataclasses.replace(m, contract=dataclasses.replace(m.contract, tokenizer=info),
                            config={**m.config, "tokenizer": tokenizer_path},
                            splits={"train": {**totals, "shards": len(m.shards)}},
                            records={"read": 20, "written": 20, "filtered": {}, "dead_lettered": {}})
    (tmp_path / "ds" / "manifest.json").write_text(m.to_json())
    return ds


def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("pileprep: error: "), err
    return err[0]


@pytest.mark.timeout(120)
def test_a_manifest_tokenizer_that_is_a_device_or_a_fifo_is_exit_2_with_the_reason(tmp_path, capsys):
    fifo = tmp_path / "tok.fifo"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo)):
        ds = _dataset(tmp_path, path)
        assert cli_main(["inspect", ds, "--examples", "1"]) == 2
        line = _one_error_line(capsys)
        assert f"config.tokenizer {path} is not a usable tokenizer" in line and "not a regular file" in line, line


def test_a_manifest_tokenizer_the_validator_refuses_is_exit_2_even_with_a_forged_sha256(tmp_path, capsys):
    spec = byte_level_spec(added=[added_token(256, "<|endoftext|>")], model={"dropout": 0.5})
    bad = tmp_path / "dropout.json"
    bad.write_bytes(as_bytes(spec))
    ds = _dataset(tmp_path, str(bad), hashlib.sha256(bad.read_bytes()).hexdigest())
    assert cli_main(["inspect", ds, "--examples", "1"]) == 2
    line = _one_error_line(capsys)
    assert "model.dropout = 0.5" in line and str(bad) in line, line
    truncating = tmp_path / "truncation.json"
    truncating.write_bytes(as_bytes({**spec, "model": {**spec["model"], "dropout": None},
                                     "truncation": {"max_length": 4}}))
    ds = _dataset(tmp_path, str(truncating), hashlib.sha256(truncating.read_bytes()).hexdigest())
    assert cli_main(["inspect", ds, "--examples", "1"]) == 2
    assert "truncation" in _one_error_line(capsys)


def test_an_explicit_tokenizer_that_cannot_be_used_is_exit_2(tmp_path, capsys):
    ds = _dataset(tmp_path, str(tmp_path / "absent.json"))
    assert cli_main(["inspect", ds, "--examples", "1", "--tokenizer", "/dev/zero"]) == 2
    assert "--tokenizer /dev/zero: not a regular file" in _one_error_line(capsys)


def test_an_absent_or_other_tokenizer_still_shows_ids_with_a_note(tmp_path, capsys):
    ds = _dataset(tmp_path, str(tmp_path / "absent.json"))
    assert cli_main(["inspect", ds, "--examples", "1"]) == 0
    out = capsys.readouterr().out
    assert f"token ids: no tokenizer file at {tmp_path / 'absent.json'}" in out, out
    other = tmp_path / "other.json"
    other.write_bytes(as_bytes(byte_level_spec(added=[added_token(256, "<|endoftext|>")], model={"dropout": 0.5})))
    ds = _dataset(tmp_path, str(other))  # the contract's sha256 is another file's: never loaded, so not judged
    assert cli_main(["inspect", ds, "--examples", "1"]) == 0
    assert "is not the contract's" in capsys.readouterr().out
