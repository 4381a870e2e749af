"""The nested near-dedup and decontamination config (pipeline/shard/near_dedup/settings.py): a typed view of
ShardConfig's flat `near_dedup*` / `decontaminate*` fields, which stay the options and the fingerprint."""
from __future__ import annotations

import pytest

from pipeline.config import ShardConfig, fingerprint
from pipeline.shard.near_dedup import settings as near_dedup_settings
from pipeline.shard.near_dedup.settings import DecontaminateConfig, NearDedupConfig
from transforms.shard.near_dedup import minhash

BASE = dict(inputs=("a/*.jsonl",), output="out", tokenizer="tok.model")
# Fingerprints (hence generation names) computed by the code before the nested config (commit 86b6001): the
# view must not move any of them.
FINGERPRINTS = {
    "1d58421326a414be": {},
    "0b313f11b568815c": dict(near_dedup=True),
    "df247457e4fa98a0": dict(near_dedup=True, near_dedup_bands=16, near_dedup_rows=8, near_dedup_threshold=0.7,
                             near_dedup_verify=True, near_dedup_shingles="tokens", near_dedup_rounds=20, seed=3),
    "3c0d42055471c63a": dict(decontaminate=("eval/*.jsonl",), decontaminate_field="q", decontaminate_ngram=8,
                             decontaminate_held_out=True),
    "fbb4b31753d599a2": dict(near_dedup=True, near_dedup_rows=5, decontaminate=("e.jsonl",)),
}


@pytest.mark.parametrize("expected", sorted(FINGERPRINTS))
def test_fingerprints_are_those_of_the_flat_config(expected):
    config = ShardConfig(**BASE, **FINGERPRINTS[expected])
    assert fingerprint(config, "ab" * 32, [["a/x.jsonl", 10]]) == expected


def test_knobs_of_a_stage_that_does_not_run_leave_the_fingerprint_alone():
    unused = ShardConfig(**BASE, near_dedup_bands=3, decontaminate_ngram=4)
    assert fingerprint(unused, "ab" * 32, [["a/x.jsonl", 10]]) == "1d58421326a414be"


def test_the_nested_view_holds_every_flat_field():
    config = ShardConfig(**BASE, **FINGERPRINTS["df247457e4fa98a0"], decontaminate=("e/*.jsonl",),
                         decontaminate_field="q", decontaminate_ngram=8, decontaminate_held_out=True)
    assert config.near_dedup_config == NearDedupConfig(True, 16, 8, 0.7, True, "tokens", 20, 3)
    assert config.near_dedup_config.params == minhash.MinHashParams(16, 8, 3, shingles="tokens")
    assert config.decontaminate_config == DecontaminateConfig(("e/*.jsonl",), "q", 8, True)
    assert config.decontaminate_config.checked_splits == [0, 1, 2]
    defaults = ShardConfig(**BASE)
    assert defaults.near_dedup_config == NearDedupConfig()  # the nested defaults are the options' defaults
    assert defaults.decontaminate_config == DecontaminateConfig()
    assert not defaults.decontaminate_config.enabled and defaults.decontaminate_config.checked_splits == [0]


def test_the_stage_runs_and_the_tokenize_stage_signs_only_when_asked():
    assert not near_dedup_settings.enabled(ShardConfig(**BASE))
    assert near_dedup_settings.enabled(ShardConfig(**BASE, decontaminate=("e.jsonl",)))
    signing = near_dedup_settings.tokenize_signing(ShardConfig(**BASE, near_dedup=True, seed=4))
    assert signing == minhash.MinHashParams(seed=4)
    for other in (dict(near_dedup_verify=True), dict(decontaminate=("e.jsonl",)), dict(near_dedup_shingles="tokens")):
        assert near_dedup_settings.tokenize_signing(ShardConfig(**BASE, near_dedup=True, **other)) is None, other
    assert near_dedup_settings.tokenize_signing(ShardConfig(**BASE)) is None
