"""A previous generation's manifest (`generations/<gen>.manifest.json`) whose `commit_seq` cannot be a real
commit's is refused in one line (exit 2) by `gc` and by a commit, before anything is published or removed
(pipeline/ops/generations.py read_history / check_order / next_commit_seq): of the wrong form or past the cap
(model_contract/manifest_check.py check_commit_seq), shared by two copies, or not below the live manifest's. Before,
each was ordered silently and decided which generation was deleted (docs/wip/hostile-review-issue28.md F5)."""
from __future__ import annotations

import json

import pytest

from model_contract import ContractError, Manifest, load_manifest
from model_contract.manifest_check import COMMIT_SEQ_LIMIT, check_commit_seq
from pipeline.ops import commit, generations
from pipeline.tools.gc import gc
from tests.manifest_fixtures import make_manifest, make_shard
from tests.unit.ops.test_generation_order import GENS, _commit, _copy, _dirs

# JSON text for "commit_seq": what the hostile review wrote into a copy (1e400 parses as a float infinity)
FORGED = ["-5", '"9"', "3.5", "null", "true", "1e400", str(2 ** 70), str(COMMIT_SEQ_LIMIT), "0"]


def _set_seq(path, text: str) -> None:
    d = json.loads(path.read_text())
    old = f'"commit_seq": {d["commit_seq"]}'
    content = path.read_text()
    assert content.count(old) == 1
    path.write_text(content.replace(old, f'"commit_seq": {text}'))


@pytest.fixture
def three(tmp_path):
    """A (1), B (2), C (3, live), every one kept; D's shards written but not committed."""
    out = tmp_path / "ds"
    for gen in GENS[:3]:
        _commit(out, gen, keep=3)
    (out / GENS[3]).mkdir()
    (out / GENS[3] / "train-00000-of-00001.tfrecord").write_bytes(b"x" * 7)  # what _commit writes before it commits
    return out


def _refused_without_change(out, action, match):
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(generations.HistoryError, match=match):
        action()
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.parametrize("value", FORGED)
def test_a_forged_commit_seq_in_a_previous_copy_is_refused_by_gc_and_by_the_next_commit(three, value):
    _set_seq(_copy(three, GENS[0]), value)
    where = f"{_copy(three, GENS[0])} commit_seq: expected an integer >= 1 and < 2\\^53"
    _refused_without_change(three, lambda: gc(str(three), keep_generations=1, yes=True), where)
    _refused_without_change(three, lambda: _commit(three, GENS[3], keep=1), where)
    assert load_manifest(str(three)).generation == GENS[2]


def test_two_copies_with_one_commit_seq_are_refused_naming_both(three):
    _set_seq(_copy(three, GENS[0]), "2")  # B's
    match = f"{_copy(three, GENS[1])}: commit_seq 2 is also {_copy(three, GENS[0])}'s"
    _refused_without_change(three, lambda: gc(str(three), keep_generations=1, yes=True), match)
    _refused_without_change(three, lambda: _commit(three, GENS[3], keep=1), match)


@pytest.mark.parametrize("value", ["3", "7"])
def test_a_previous_copy_not_below_the_live_commit_seq_is_refused(three, value):
    _set_seq(_copy(three, GENS[0]), value)  # C, the live one, has 3
    match = f"{_copy(three, GENS[0])}: commit_seq {value} is not below the live manifest's 3 \\({GENS[2]}\\)"
    if value == "3":  # shared with C's own copy: refused as a duplicate first
        match = "commit_seq 3 is also"
    _refused_without_change(three, lambda: gc(str(three), keep_generations=1, yes=True), match)
    _refused_without_change(three, lambda: _commit(three, GENS[3], keep=1), match)


def test_the_copy_a_killed_commit_left_is_rewritten_when_that_generation_commits_again(three):
    """A commit writes its copy, then publishes: killed in between, its copy has seq 4 > the live 3. The retry of
    that generation commits (the copy is its own); another generation is refused, naming the copy to remove."""
    killed = make_manifest(GENS[3], [make_shard(GENS[3], size=7)])
    killed.commit_seq = 4
    generations.write_generation_manifest(str(three), GENS[3], killed.to_json())
    assert load_manifest(str(_copy(three, GENS[3]))).commit_seq == 4
    with pytest.raises(generations.HistoryError, match=f"{GENS[3]} was never live: remove that file"):
        _commit(three, GENS[4], keep=1)
    _commit(three, GENS[3], keep=1)
    assert load_manifest(str(three)).commit_seq == 5 and load_manifest(str(_copy(three, GENS[3]))).commit_seq == 5
    # C, live just before D, is the one previous generation kept (E: the refused commit's, never committed)
    assert _dirs(three) == GENS[2:5] and not _copy(three, GENS[4]).exists()


def test_the_next_commit_seq_stays_below_the_cap(three):
    for path in (three / "manifest.json", _copy(three, GENS[2])):
        _set_seq(path, str(COMMIT_SEQ_LIMIT - 1))
    _refused_without_change(three, lambda: _commit(three, GENS[3], keep=1), "the next commit_seq: expected an "
                                                                            "integer >= 1 and < 2\\^53")


@pytest.mark.parametrize("value", [None, COMMIT_SEQ_LIMIT, float("inf"), 2 ** 64, True, "1", 0])
def test_the_live_manifest_is_held_to_the_same_rule(value):
    d = make_manifest(GENS[0], [make_shard(GENS[0], size=7)]).to_dict()
    d["commit_seq"] = value
    with pytest.raises(ContractError, match="manifest commit_seq: expected an integer >= 1 and < 2\\^53"):
        Manifest.from_json(json.dumps(d))
    assert check_commit_seq(COMMIT_SEQ_LIMIT - 1) == COMMIT_SEQ_LIMIT - 1
