"""The shard job's plan (pipeline/shard/plan.py): one decision (NothingToDo | Build) and a committed dataset of
another configuration refused by name. A real (small) shard run on the tiny tokenizer trained in the tests."""
from __future__ import annotations

import dataclasses

import pytest

from pipeline.config import ShardConfig
from pipeline.errors import ConfigError
from pipeline.job import Build, NothingToDo
from pipeline.shard import plan as shard_plan
from pipeline.shard import shard_pipeline
from tests.corpus_fixtures import write_good_corpus

IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


@pytest.fixture(scope="module")
def committed(tiny_tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("pcorpus")
    write_good_corpus(root, limit_bytes=60_000, files=2)
    out = tmp_path_factory.mktemp("pds") / "ds"
    config = ShardConfig(inputs=(str(root / "*"),), output=str(out), tokenizer=tiny_tokenizer, seq_len=128,
                         num_shards=1, val_fraction=0.1, test_fraction=0.0)
    shard_pipeline.run(config, IN_MEMORY, progress_every_s=0)
    return config


def test_the_same_build_again_is_nothing_to_do_and_a_new_input_is_a_build(committed, tmp_path):
    decision = shard_plan.decide(shard_pipeline.prepare(committed))
    assert isinstance(decision, NothingToDo) and "already holds generation" in decision.message
    elsewhere = dataclasses.replace(committed, output=str(tmp_path / "new"))
    assert isinstance(shard_plan.decide(shard_pipeline.prepare(elsewhere)), Build)
    incremental = shard_pipeline.prepare(committed, incremental_run=True)  # every file is already in it
    assert shard_plan.decide(incremental) == NothingToDo(
        f"nothing to do: {committed.output} already holds every input file", incremental.previous.generation)


def test_another_configuration_into_a_committed_dataset_is_refused_naming_what_differs(committed):
    longer = dataclasses.replace(committed, seq_len=256)
    with pytest.raises(ConfigError, match=r"--output .* another configuration \(seq_len 128 → 256\); pass "
                                          r"--overwrite"):
        shard_pipeline.prepare(longer)
    plan = shard_pipeline.prepare(dataclasses.replace(longer, overwrite=True))  # asked for: a new generation
    assert isinstance(shard_plan.decide(plan), Build) and plan.generation != plan.previous.generation


def test_another_seed_and_source_field_are_named_too(committed):
    other = dataclasses.replace(committed, seed=7, source_fields=("source",))
    with pytest.raises(ConfigError) as err:
        shard_pipeline.prepare(other)
    assert "seed 0 → 7" in str(err.value) and "source_fields [meta.pile_set_name] → [source]" in str(err.value)
