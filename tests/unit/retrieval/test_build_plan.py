"""pipeline/retrieval/build_plan.py on its own: what of a dataset identifies the database built from it, and the
refusal of a dataset without a manifest (prepare on a real dataset: tests/e2e/test_retrieval_pipeline.py)."""
from __future__ import annotations

import pytest

from pipeline.errors import ConfigError
from pipeline.retrieval import build_plan
from pipeline.retrieval.config import BuildConfig


def _manifest(**changes):
    manifest = {"generation": "gen-" + "1" * 16, "contract": {"seq_len": 128, "tokenizer": {"model_sha256": "ab"}},
                "shards": [{"path": "gen-1/train-0.tfrecord", "sha256": "cd", "bytes": 9}], "statistics": {}}
    manifest.update(changes)
    return manifest


def test_the_identity_is_generation_tokenizer_seq_len_and_each_shards_hash():
    identity = build_plan.dataset_identity(_manifest())
    assert identity == {"generation": "gen-" + "1" * 16, "tokenizer": "ab", "seq_len": 128,
                        "shards": [("gen-1/train-0.tfrecord", "cd")]}
    assert build_plan.dataset_identity(_manifest(statistics={"other": 1})) == identity  # reports do not count
    changed = _manifest(shards=[{"path": "gen-1/train-0.tfrecord", "sha256": "ef", "bytes": 9}])
    assert build_plan.dataset_identity(changed) != identity


def test_a_dataset_without_a_manifest_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="no manifest.json"):
        build_plan.prepare(BuildConfig(dataset=str(tmp_path / "ds"), output=str(tmp_path / "db")))
