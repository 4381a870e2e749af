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
