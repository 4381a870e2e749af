"""pipeline/tools/inspect_dataset.py: inspect refuses a shard path outside the dataset."""
from __future__ import annotations

import json

import numpy as np

from model_contract import encode_example, frame_record
from tests.manifest_fixtures import valid_manifest_dict


def test_inspect_refuses_a_shard_path_outside_the_dataset(tmp_path, capsys):
    from pipeline.cli import main as cli_main

    (tmp_path / "secret.tfrecord").write_bytes(frame_record(encode_example({"input_ids": np.arange(3)})))
    d = valid_manifest_dict()
    d["shards"][0]["path"] = "../secret.tfrecord"
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(d))
    assert cli_main(["inspect", str(tmp_path / "ds")]) == 2
    assert "shards[0].path '../secret.tfrecord'" in capsys.readouterr().err


def test_inspect_decodes_only_with_the_contracts_tokenizer(tmp_path, tiny_tokenizer, capsys):
    """A --tokenizer (or the recorded config.tokenizer) whose sha256 is not the contract's is not used to decode:
    one line says so, naming both sha256s, and the examples are shown as ids (the report's check,
    pipeline/tools/report.py contract_tokenizer)."""
    import dataclasses
    import hashlib

    from model_contract import load_manifest
    from pipeline.cli import main as cli_main
    from pipeline.tools.inspect_dataset import inspect
    from tests.trainer_fixtures import write_dataset
    from transforms.tokenize import tokenizer

    ds = write_dataset(str(tmp_path / "ds"), n_docs=20, n_shards=1)
    m = load_manifest(ds)
    model = tokenizer.read_model_bytes(tiny_tokenizer)
    info = tokenizer.describe(tokenizer.load_processor(model, tiny_tokenizer), model)
    other = tmp_path / "other.model"
    other.write_bytes(model + b"\xc0\x3e\x01")  # an unknown protobuf field 1000: another file that still loads
    totals = {k: sum(getattr(s, k) for s in m.shards) for k in ("examples", "documents", "tokens", "padding_tokens")}
    m = dataclasses.replace(m, contract=dataclasses.replace(m.contract, tokenizer=info),
                            config={**m.config, "tokenizer": str(other)},
                            splits={"train": {**totals, "shards": len(m.shards)}},
                            records={"read": 20, "written": 20, "filtered": {}, "dead_lettered": {}})
    (tmp_path / "ds" / "manifest.json").write_text(m.to_json())
    right = inspect(ds, examples=1, tokenizer_path=tiny_tokenizer).splitlines()
    assert not any("token ids" in line for line in right) and not right[-1].startswith("["), right
    other_sha = hashlib.sha256(other.read_bytes()).hexdigest()
    for args in (["--tokenizer", str(other)], []):  # given, and recorded in the manifest
        capsys.readouterr()
        assert cli_main(["inspect", ds, "--examples", "1", *args]) == 0
        lines = capsys.readouterr().out.splitlines()
        notes = [line for line in lines if "token ids" in line]
        assert len(notes) == 1 and other_sha[:12] in notes[0] and info.model_sha256[:12] in notes[0], lines
        assert lines[-1].startswith("["), lines  # ids, not another tokenizer's text


def test_a_negative_examples_count_is_exit_2_in_one_line(tmp_path, capsys):
    """`inspect --examples -1` printed the summary and exited 0 (issue 29): a count below 0 is a bad
    configuration, refused by the parser (the same dataset with --examples 0 is exit 0)."""
    from pipeline.cli import main as cli_main
    from tests.trainer_fixtures import write_dataset

    ds = write_dataset(str(tmp_path / "ds"), n_docs=4, n_shards=1)
    assert cli_main(["inspect", ds, "--json", "--examples", "0"]) == 0
    capsys.readouterr()
    assert cli_main(["inspect", ds, "--json", "--examples", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pileprep: error: ") and "--examples" in err[0], err
    assert "0 or more" in err[0] and "-1" in err[0], err
