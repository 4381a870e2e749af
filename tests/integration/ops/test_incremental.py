"""`pileprep shard --incremental` adds only new input files as a new generation; changed or
removed inputs are reported, not mixed in; the same schedule twice does nothing the second time (the ledger's
diff itself: tests/unit/ops/test_incremental.py).
"""
from __future__ import annotations

import json
import os
import shutil

import pytest

from model_contract import Manifest
from pipeline.cli import main as cli_main
from pipeline.config import ShardConfig
from pipeline.ops import incremental
from pipeline.shard import shard_pipeline
from tests.ops_fixtures import FAST_LOCAL, real_corpus, tokenizer_path

pytestmark = pytest.mark.timeout(240)


# ------------------------------------------------------------------------------------------ end to end
def _config(inbox, out, **kw):
    base = dict(inputs=(str(inbox / "*"),), output=str(out), tokenizer=tokenizer_path(), seq_len=256,
                num_shards=None, target_shard_mb=0.5, val_fraction=0.2, test_fraction=0.1)
    base.update(kw)
    return ShardConfig(**base)


def _run(cfg, **kw):
    return shard_pipeline.run(cfg, FAST_LOCAL, incremental_run=True, progress_every_s=0, **kw)


@pytest.fixture(scope="module")
def scheduled(tmp_path_factory):
    """Three scheduled runs: two files, then two more arrive, then nothing new."""
    tmp = tmp_path_factory.mktemp("inc")
    corpus = real_corpus(tmp / "corpus")
    files = sorted(corpus.iterdir())
    inbox, out = tmp / "inbox", tmp / "out"
    inbox.mkdir()
    for p in files[:2]:
        shutil.copy(p, inbox / p.name)
    first = _run(_config(inbox, out))
    for p in files[2:4]:
        shutil.copy(p, inbox / p.name)
    second = _run(_config(inbox, out))
    return {"tmp": tmp, "files": files, "inbox": inbox, "out": out, "first": first, "second": second}


def test_second_run_adds_a_generation_and_lists_all_shards(scheduled):
    first, second, out = scheduled["first"], scheduled["second"], scheduled["out"]
    assert len(first["generations"]) == 1 and len(second["generations"]) == 2
    g1, g2 = (g["name"] for g in second["generations"])
    assert g1 == first["generation"] and g2 == second["generation"] != g1
    paths = [s["path"] for s in second["shards"]]
    assert paths[:len(first["shards"])] == [s["path"] for s in first["shards"]]  # gen 1 kept as it was
    assert {p.split("/")[0] for p in paths} == {g1, g2}
    for p in paths:
        assert (out / p).is_file()
    ledger = second["ledger"]
    assert sorted(r["path"] for r in ledger) == sorted(str(scheduled["inbox"] / p.name)
                                                       for p in scheduled["files"][:4])
    assert {r["generation"] for r in ledger} == {g1, g2}
    assert all(len(r["sha256"]) == 64 and r["bytes"] > 0 and r["mtime"] > 0 for r in ledger)
    # Totals are the sum over generations and agree with the shard list.
    for split, agg in second["splits"].items():
        shards = [s for s in second["shards"] if s["split"] == split]
        assert agg["shards"] == len(shards)
        assert agg["tokens"] == sum(s["tokens"] for s in shards)
        assert agg["examples"] == sum(s["examples"] for s in shards)
    assert second["records"]["read"] == second["records"]["written"] + sum(
        second["records"]["filtered"].values()) + sum(second["records"]["dead_lettered"].values())
    assert sum(g["shards"] for g in second["generations"]) == len(second["shards"])
    Manifest.from_dict(second)  # still a valid manifest for the trainer's side


def test_same_schedule_twice_does_nothing(scheduled, capsys):
    out = scheduled["out"]
    before = (out / "manifest.json").read_bytes()
    listing = sorted(os.listdir(out))
    rc = cli_main(["shard", "--input", str(scheduled["inbox"] / "*"), "--output", str(out), "--tokenizer",
                   tokenizer_path(), "--seq-len", "256", "--target-shard-mb", "0.5", "--val-fraction", "0.2",
                   "--test-fraction", "0.1", "--incremental", "--progress-every", "0", *FAST_LOCAL])
    assert rc == 0
    assert "nothing to do" in capsys.readouterr().out
    assert (out / "manifest.json").read_bytes() == before and sorted(os.listdir(out)) == listing
    # A `touch` (new mtime, same bytes) is not a change either: the sha256 settles it.
    target = scheduled["inbox"] / scheduled["files"][0].name
    os.utime(target, (1e9, 1e9))
    again = _run(_config(scheduled["inbox"], out))
    assert json.dumps(again, sort_keys=True) == json.dumps(json.loads(before), sort_keys=True)


def test_changed_or_removed_input_is_reported_not_mixed(scheduled, capsys):
    out, inbox, files = scheduled["out"], scheduled["inbox"], scheduled["files"]
    before = (out / "manifest.json").read_bytes()
    changed = inbox / files[1].name
    saved = changed.read_bytes()
    try:
        changed.write_bytes(saved[:-1] + bytes([saved[-1] ^ 1]))  # same size, different bytes
        (inbox / files[2].name).rename(scheduled["tmp"] / "moved-away")
        with pytest.raises(incremental.InputsChangedError) as err:
            _run(_config(inbox, out))
        msg = str(err.value)
        assert f"changed since generation {scheduled['first']['generation']}: {changed}" in msg
        assert f"removed since generation {scheduled['second']['generation']}: {inbox / files[2].name}" in msg
        assert "without --incremental" in msg
        # The CLI says the same and exits 2.
        rc = cli_main(["shard", "--input", str(inbox / "*"), "--output", str(out), "--tokenizer", tokenizer_path(),
                       "--seq-len", "256", "--target-shard-mb", "0.5", "--val-fraction", "0.2", "--test-fraction",
                       "0.1", "--incremental", "--progress-every", "0", *FAST_LOCAL])
        assert rc == 2 and str(changed) in capsys.readouterr().err
        assert (out / "manifest.json").read_bytes() == before
    finally:
        changed.write_bytes(saved)
        (scheduled["tmp"] / "moved-away").rename(inbox / files[2].name)


def test_incompatible_settings_are_refused_by_name(scheduled):
    with pytest.raises(incremental.IncompatibleGenerationError) as err:
        _run(_config(scheduled["inbox"], scheduled["out"], seq_len=128, seed=3))
    assert "contract.seq_len" in str(err.value) and "config.seed" in str(err.value)


def test_a_third_generation_with_a_different_shard_size_is_fine(scheduled):
    """Non-shaping knobs (shard count/size, work unit) may change between scheduled runs."""
    shutil.copy(scheduled["files"][4], scheduled["inbox"] / scheduled["files"][4].name)
    third = _run(_config(scheduled["inbox"], scheduled["out"], target_shard_mb=1024.0, num_shards=1, unit_mb=1.0))
    assert len(third["generations"]) == 3 and len(third["ledger"]) == 5


def test_generation_names_never_reuse_a_live_generation(tmp_path):
    """An incremental generation is named by its parents too, and a full rebuild whose name a live,
    multi-generation dataset already uses takes a new one: no generation is ever rewritten in place."""
    files = sorted(real_corpus(tmp_path / "corpus").iterdir())
    inbox, out = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    shutil.copy(files[0], inbox / files[0].name)
    first = _run(_config(inbox, out))
    shutil.copy(files[1], inbox / files[1].name)
    second = _run(_config(inbox, out))
    live = {g["name"] for g in second["generations"]}
    assert live == {first["generation"], second["generation"]}
    # a full build over both files is not the incremental generation that added the second one
    full_both = shard_pipeline.prepare(_config(inbox, out), incremental_run=False)
    assert full_both.generation not in live
    # the second file goes away; a full rebuild over the first alone would be named like generation 1
    (inbox / files[1].name).unlink()
    rebuild = shard_pipeline.prepare(_config(inbox, out), incremental_run=False)
    assert rebuild.generation not in live
    assert not rebuild.nothing_to_do
