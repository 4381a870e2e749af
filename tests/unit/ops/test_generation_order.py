"""Generation order is what the manifests record (`commit_seq`, pipeline/ops/generations.py), never file mtimes:
after a `cp -r`, a sync or a `touch`, a commit's prune and `pileprep gc` still keep the generation that was live
just before the current one. Manifests written before `commit_seq` existed are ordered safely (kept while the
order matters)."""
from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from model_contract import ContractError, Manifest, load_manifest
from pipeline.ops import commit, generations
from pipeline.tools.gc import gc
from tests.manifest_fixtures import make_manifest, make_shard

GENS = [f"gen-{c * 16}" for c in "abcde"]


def _commit(out, gen, keep=1):
    (out / gen).mkdir(parents=True, exist_ok=True)
    (out / gen / "train-00000-of-00001.tfrecord").write_bytes(b"x" * 7)
    prev = commit.read_committed(str(out))
    commit.commit_dataset(str(out), make_manifest(gen, [make_shard(gen, size=7)]),
                          None if prev is None else prev.generation, str(out / "_staging" / gen), prev,
                          keep_generations=keep)


def _dirs(out) -> list:
    return sorted(p.name for p in out.glob("gen-*"))


def _copy(out, gen):
    return out / "generations" / f"{gen}.manifest.json"


def _make_newest_by_mtime(path):
    future = time.time() + 3600
    os.utime(path, (future, future))


def test_each_commit_records_one_more_than_the_last_and_a_retried_commit_keeps_its_number(tmp_path):
    out = tmp_path / "ds"
    for gen in GENS[:3]:
        _commit(out, gen, keep=2)
    assert [load_manifest(str(_copy(out, g))).commit_seq for g in GENS[:3]] == [1, 2, 3]
    assert load_manifest(str(out)).commit_seq == 3
    before = (out / "manifest.json").read_bytes()
    prev = commit.read_committed(str(out))  # the same commit again (Beam retrying the bundle): equal bytes
    commit.commit_dataset(str(out), make_manifest(GENS[2], [make_shard(GENS[2], size=7)]), GENS[1],
                          str(out / "_staging" / GENS[2]), prev, keep_generations=2)
    assert (out / "manifest.json").read_bytes() == before


def test_a_touched_older_copy_does_not_make_the_commit_remove_the_previous_live_generation(tmp_path):
    out = tmp_path / "ds"
    _commit(out, GENS[0])
    _commit(out, GENS[1])  # live B, A kept (--keep-generations 1)
    _make_newest_by_mtime(_copy(out, GENS[0]))  # a `touch` (or a copy) makes A's manifest the newest file
    _commit(out, GENS[2])
    assert _dirs(out) == GENS[1:3]  # B, live just before C, is kept; A goes


def test_gc_orders_a_copied_dataset_by_commit_sequence_not_by_mtime(tmp_path):
    src = tmp_path / "ds"
    for gen in GENS[:3]:
        _commit(src, gen, keep=2)
    copied = tmp_path / "copy"
    shutil.copytree(src, copied)  # like `cp -r` without -p: every file gets a new mtime, in copy order
    _make_newest_by_mtime(_copy(copied, GENS[0]))
    result = gc(str(copied), keep_generations=1, yes=True)
    assert [g for g, _why in result.plan.remove] == [GENS[0]]
    assert _dirs(copied) == GENS[1:3]


def _strip_commit_seq(path):
    m = Manifest.from_json(path.read_text())
    m.commit_seq = None
    path.write_text(m.to_json())


def test_manifests_without_commit_seq_are_kept_until_enough_newer_generations_exist(tmp_path):
    """A dataset committed by an older pileprep: its copies record no order. The first commit after the upgrade
    keeps every one of them (the previous live one is among them), the next removes them."""
    out = tmp_path / "ds"
    for gen in GENS[:3]:
        _commit(out, gen, keep=3)
    for gen in GENS[:3]:
        _strip_commit_seq(_copy(out, gen))
    _strip_commit_seq(out / "manifest.json")
    _make_newest_by_mtime(_copy(out, GENS[0]))  # mtimes say A is the newest: they must not decide
    _commit(out, GENS[3])  # C (live before D) is among the copies of unknown order: all kept
    assert _dirs(out) == GENS[:4]
    assert load_manifest(str(out)).commit_seq == 1
    plan = generations.plan_prune(generations.read_state(str(out), {GENS[3]}), 1, drop_stale_refs=True)
    kept = {g: why for g, why in plan.keep if g != GENS[3]}
    assert set(kept) == set(GENS[:3]) and not plan.remove
    assert all("no commit order" in why for why in kept.values())
    _commit(out, GENS[4])  # D is the newest previous one, by its commit_seq: the old ones go
    assert _dirs(out) == GENS[3:5]
    assert load_manifest(str(out)).commit_seq == 2


@pytest.mark.parametrize("value", ["1", 0, -1, True, 1.5])
def test_a_commit_seq_of_the_wrong_form_is_refused(value):
    d = make_manifest(GENS[0], [make_shard(GENS[0], size=7)]).to_dict()
    d["commit_seq"] = value
    with pytest.raises(ContractError, match="commit_seq"):
        Manifest.from_json(json.dumps(d))


def test_a_manifest_without_commit_seq_still_reads_and_writes_the_same_bytes():
    m = make_manifest(GENS[0], [make_shard(GENS[0], size=7)])
    text = m.to_json()
    assert "commit_seq" not in text
    assert Manifest.from_json(text).commit_seq is None and Manifest.from_json(text).to_json() == text
