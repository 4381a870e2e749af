"""Each commit records the generation that was live before it (`previous_generation`, model_contract/manifest.py),
so swapping two valid `commit_seq` values between older generation manifests is caught: `gc` and the next commit
refuse in one line naming both copies, before anything is removed (pipeline/ops/generations.py check_chain;
rv2 review F6: the swap made `gc --keep-generations 1` keep the oldest and delete the real previous generation)."""
from __future__ import annotations

import json

import pytest

from model_contract import ContractError, Manifest, load_manifest
from pipeline.ops import commit, generations
from pipeline.tools.gc import gc
from tests.manifest_fixtures import make_manifest, make_shard
from tests.ops_fixtures import run_cli
from tests.unit.ops.test_generation_order import GENS, _commit, _copy, _dirs
from tests.unit.ops.test_generation_seq_forgery import _refused_without_change, _set_seq


def _three(tmp_path):
    out = tmp_path / "ds"
    for gen in GENS[:3]:
        _commit(out, gen, keep=5)
    return out


def _swap_older_seqs(out) -> None:
    """A (1) and B (2) swapped: both values valid, unique and below the live C's 3."""
    _set_seq(_copy(out, GENS[0]), "2")
    _set_seq(_copy(out, GENS[1]), "1")


def test_each_commit_records_the_generation_live_before_it(tmp_path):
    out = _three(tmp_path)
    raw = [json.loads(_copy(out, g).read_text()) for g in GENS[:3]]
    assert [d["previous_generation"] for d in raw] == [None, GENS[0], GENS[1]]  # null (not absent) for the first
    assert load_manifest(str(out)).previous_generation == GENS[1]
    before = (out / "manifest.json").read_bytes()
    prev = commit.read_committed(str(out))  # the same commit again (a retried bundle): equal bytes
    commit.commit_dataset(str(out), make_manifest(GENS[2], [make_shard(GENS[2], size=7)]), GENS[1],
                          str(out / "_staging" / GENS[2]), prev, keep_generations=5)
    assert (out / "manifest.json").read_bytes() == before


def test_swapped_seqs_of_the_two_older_generations_are_refused_by_gc_cli_and_nothing_is_removed(tmp_path):
    out = _three(tmp_path)
    _swap_older_seqs(out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    result = run_cli(["gc", str(out), "--keep-generations", "1", "--yes"], timeout_s=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("pileprep: error: "), result.stderr
    assert str(_copy(out, GENS[1])) in lines[0] and str(_copy(out, GENS[0])) in lines[0]
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert _dirs(out) == GENS[:3]


def test_swapped_seqs_are_refused_by_the_next_commit_before_it_publishes(tmp_path):
    out = _three(tmp_path)
    _swap_older_seqs(out)
    match = f"{_copy(out, GENS[1])}: commit_seq 1 with previous_generation {GENS[0]}"
    (out / GENS[3]).mkdir()  # what _commit writes before it commits
    (out / GENS[3] / "train-00000-of-00001.tfrecord").write_bytes(b"x" * 7)
    _refused_without_change(out, lambda: gc(str(out), keep_generations=1, yes=True), match)
    _refused_without_change(out, lambda: _commit(out, GENS[3], keep=1), match)
    assert load_manifest(str(out)).generation == GENS[2]


def test_a_copy_naming_itself_is_refused(tmp_path):
    out = _three(tmp_path)
    path = _copy(out, GENS[1])
    path.write_text(path.read_text().replace(f'"previous_generation": "{GENS[0]}"',
                                             f'"previous_generation": "{GENS[1]}"'))
    _refused_without_change(out, lambda: gc(str(out), keep_generations=1, yes=True),
                            f"previous_generation {GENS[1]}, but {_copy(out, GENS[1])}")


def test_an_untampered_dataset_gcs_as_before(tmp_path):
    out = _three(tmp_path)
    gc(str(out), keep_generations=1, yes=True)
    assert _dirs(out) == GENS[1:3]  # the oldest removed, the real previous generation kept


def test_a_dataset_whose_oldest_generation_was_removed_still_commits_and_gcs(tmp_path):
    out = _three(tmp_path)
    generations.remove_generation(str(out), GENS[0])  # B's predecessor is gone: accepted
    _commit(out, GENS[3], keep=5)
    assert json.loads(_copy(out, GENS[3]).read_text())["previous_generation"] == GENS[2]
    gc(str(out), keep_generations=1, yes=True)
    assert _dirs(out) == GENS[2:4]


def test_copies_from_before_the_field_are_ordered_as_before(tmp_path):
    out = _three(tmp_path)
    for gen in GENS[:3]:  # as an older pileprep wrote them: no previous_generation key
        path = _copy(out, gen)
        d = json.loads(path.read_text())
        del d["previous_generation"]
        path.write_text(json.dumps(d, sort_keys=True, indent=1) + "\n")
    assert "previous_generation" not in load_manifest(str(_copy(out, GENS[1]))).to_dict()
    _swap_older_seqs(out)  # undetectable without the field: gc orders by commit_seq, as it did
    gc(str(out), keep_generations=1, yes=True)
    assert _dirs(out) == [GENS[0], GENS[2]]


def test_a_previous_generation_of_the_wrong_form_is_refused_on_load():
    d = make_manifest(GENS[1], [make_shard(GENS[1], size=7)]).to_dict()
    for bad in ["../x", 5, ["gen-" + "a" * 16]]:
        with pytest.raises(ContractError, match="previous_generation"):
            Manifest.from_dict({**d, "previous_generation": bad})
    assert Manifest.from_dict({**d, "previous_generation": None}).to_dict()["previous_generation"] is None
