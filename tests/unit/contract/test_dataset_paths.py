"""model_contract/dataset_paths.py: the one resolver keeps manifest-relative paths inside the dataset."""
from __future__ import annotations

import pytest

from model_contract import ContractError
from model_contract.dataset_paths import resolve_shard_path
from tests.manifest_fixtures import GEN_A, make_shard


def test_the_one_resolver_keeps_shard_paths_inside_the_dataset():
    assert resolve_shard_path("/d/manifest.json", make_shard(GEN_A)) == f"/d/{GEN_A}/train-00000-of-00001.tfrecord"
    assert resolve_shard_path("s3://b/p/manifest.json", "x/y.tfrecord") == "s3://b/p/x/y.tfrecord"
    for bad in ("/etc/passwd", "../x", "a/../../x", "a//b", "s3://other/x", "a\\..\\x", ""):
        with pytest.raises(ContractError, match="shard path"):
            resolve_shard_path("/d/manifest.json", bad)
