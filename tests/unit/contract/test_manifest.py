"""model_contract/manifest.py: names read back from a manifest (paths, generations) stay inside the dataset."""
from __future__ import annotations

import json
import re

import pytest

from model_contract import ContractError, Manifest
from tests.manifest_fixtures import GEN_A, make_shard, valid_manifest_dict


@pytest.mark.parametrize("entry,damage", [
    ("generations[0].name", lambda d: d["generations"][0].update(name="/tmp/victim")),
    ("generations[0].name", lambda d: d["generations"][0].update(name="../..")),
    ("generation", lambda d: d.update(generation="gen-0123456789abcdef/../../x")),
    ("shards[0].path", lambda d: d["shards"][0].update(path="/etc/passwd")),
    ("shards[0].path", lambda d: d["shards"][0].update(path=f"{GEN_A}/../../x.tfrecord")),
    ("dead_letters[0]", lambda d: d.update(dead_letters=["../outside.jsonl"])),
    ("ledger[0].generation", lambda d: d["ledger"][0].update(generation="..")),
    ("ledger[0].bytes", lambda d: d["ledger"][0].update(bytes="many")),
    ("generations[0].tokens", lambda d: d["generations"][0].update(tokens=-1)),
])
def test_a_damaged_manifest_is_refused_naming_the_entry(entry, damage):
    d = valid_manifest_dict()
    assert Manifest.from_json(json.dumps(d)).generation == GEN_A
    damage(d)
    with pytest.raises(ContractError, match=re.escape(entry)):
        Manifest.from_json(json.dumps(d))


def test_the_one_resolver_keeps_shard_paths_inside_the_dataset():
    from model_contract import resolve_shard_path

    assert resolve_shard_path("/d/manifest.json", make_shard(GEN_A)) == f"/d/{GEN_A}/train-00000-of-00001.tfrecord"
    assert resolve_shard_path("s3://b/p/manifest.json", "x/y.tfrecord") == "s3://b/p/x/y.tfrecord"
    for bad in ("/etc/passwd", "../x", "a/../../x", "a//b", "s3://other/x", "a\\..\\x", ""):
        with pytest.raises(ContractError, match="shard path"):
            resolve_shard_path("/d/manifest.json", bad)
