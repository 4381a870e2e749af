"""Kept generations (pipeline/ops/generations.py, pipeline/ops/commit.py), refs (model_contract/refs.py),
`pileprep gc` (pipeline/tools/gc.py), the trainer's pinning (trainer/dataset.py) and export's ref."""
from __future__ import annotations

import json
import os

import pytest

from model_contract import ContractError, Manifest, load_manifest
from model_contract import refs
from pipeline import cli
from pipeline.ops import commit
from pipeline.tools.gc import gc
from tests.manifest_fixtures import make_manifest, make_shard
from tests.ops_fixtures import s3_server  # noqa: F401 - fixture

GENS = [f"gen-{c * 16}" for c in "abcd"]


def _commit(out, gen, previous, keep=1):
    """Commit a one-shard generation `gen` on top of `previous` (its shard file written first, as a run does)."""
    (out / gen).mkdir(parents=True, exist_ok=True)
    (out / gen / "train-00000-of-00001.tfrecord").write_bytes(b"x" * 7)
    prev = commit.read_committed(str(out))
    commit.commit_dataset(str(out), make_manifest(gen, [make_shard(gen, size=7)]), previous,
                          str(out / "_staging" / gen), prev, keep_generations=keep)


def _build(out, gens, keep=1):
    previous = None
    for gen in gens:
        _commit(out, gen, previous, keep)
        previous = gen


def _dirs(out) -> list:
    return sorted(p.name for p in out.glob("gen-*"))


def _copies(out) -> list:
    return sorted(p.name for p in (out / "generations").iterdir())


def _ref(out, gen, holder, kind="trainer") -> str:
    return refs.write_ref_local(str(out), refs.Ref(gen, kind, str(holder), 1.0))


def test_each_commit_writes_its_manifest_and_keeps_the_previous_generation(tmp_path):
    out = tmp_path / "ds"
    _build(out, GENS[:2])
    assert _dirs(out) == GENS[:2]  # B committed: A kept beside it (--keep-generations 1)
    assert _copies(out) == [f"{g}.manifest.json" for g in GENS[:2]]
    # The copy is the bytes manifest.json had, and loads (validated) through model_contract.
    assert (out / "generations" / f"{GENS[1]}.manifest.json").read_bytes() == (out / "manifest.json").read_bytes()
    assert refs.load_generation_manifest(str(out), GENS[0]).generation == GENS[0]
    _commit(out, GENS[2], GENS[1])
    assert _dirs(out) == GENS[1:3] and _copies(out) == [f"{g}.manifest.json" for g in GENS[1:3]]


@pytest.mark.parametrize("keep, left", [(0, GENS[3:]), (2, GENS[1:])])
def test_keep_generations_is_how_many_previous_ones_stay(tmp_path, keep, left):
    out = tmp_path / "ds"
    _build(out, GENS, keep)
    assert _dirs(out) == left


def test_a_dataset_committed_before_generations_gets_its_live_manifest_kept(tmp_path):
    out = tmp_path / "ds"
    (out / GENS[0]).mkdir(parents=True)
    (out / GENS[0] / "train-00000-of-00001.tfrecord").write_bytes(b"x" * 7)
    old = make_manifest(GENS[0], [make_shard(GENS[0], size=7)])
    commit.publish_manifest(str(out), old.to_json())  # no generations/ yet
    _commit(out, GENS[1], GENS[0])
    assert _dirs(out) == GENS[:2]
    assert (out / "generations" / f"{GENS[0]}.manifest.json").read_text() == old.to_json()


def test_a_ref_keeps_its_generation_through_commits_until_gc_yes_after_its_holder_is_gone(tmp_path, capsys):
    out, holder = tmp_path / "ds", tmp_path / "checkpoints"
    holder.mkdir()
    _build(out, GENS[:1])
    _ref(out, GENS[0], holder)
    _build_on = GENS[1:]
    previous = GENS[0]
    for gen in _build_on:
        _commit(out, gen, previous, keep=0)
        previous = gen
    assert _dirs(out) == [GENS[0], GENS[3]]  # B and C pruned, A named by the ref
    result = gc(str(out), keep_generations=0)
    assert not result.removed and [g for g, _ in result.plan.keep] == [GENS[3], GENS[0]]
    holder.rmdir()
    dry = gc(str(out), keep_generations=0)
    text = dry.render()
    assert [g for g, _ in dry.plan.remove] == [GENS[0]] and "would remove gen-aaaa" in text and "7 bytes" in text
    assert "no longer exists" in text and _dirs(out) == [GENS[0], GENS[3]]  # dry: nothing removed
    assert len(list((out / ".refs").iterdir())) == 1
    assert cli.main(["gc", str(out), "--keep-generations", "0", "--yes"]) == 0
    assert "removed gen-aaaa" in capsys.readouterr().out
    assert _dirs(out) == [GENS[3]] and _copies(out) == [f"{GENS[3]}.manifest.json"]
    assert list((out / ".refs").iterdir()) == []


def test_gc_keeps_what_the_live_manifest_and_keep_generations_name(tmp_path):
    out = tmp_path / "ds"
    _build(out, GENS[:3], keep=2)
    assert _dirs(out) == GENS[:3]
    result = gc(str(out), keep_generations=1, yes=True)
    assert [g for g, _ in result.plan.remove] == [GENS[0]] and _dirs(out) == GENS[1:3]
    assert result.freed == 7
    # an uncommitted directory (an interrupted run's) is the shard run's to clean up, not gc's
    (out / GENS[3]).mkdir()
    result = gc(str(out), keep_generations=0, yes=True)
    assert result.plan.uncommitted == [GENS[3]] and _dirs(out) == [GENS[2], GENS[3]]


@pytest.mark.parametrize("name, content", [
    ("trainer-0123456789abcdef.json", b"{not json"),
    ("trainer-0123456789abcdef.json", json.dumps({"format": "pileprep.ref", "generation": "../../victim",
                                                  "kind": "trainer", "holder": "/x", "created": 1}).encode()),
    ("export-0123456789abcdef.json", json.dumps({"format": "pileprep.ref", "generation": GENS[0],
                                                 "kind": "export", "holder": "/x", "created": 1}).encode()),  # name
    ("notes.txt", b"hello"),
    ("trainer-0123456789abcdef.json", b"\x1b[2J" * 30000),
])
def test_a_damaged_ref_is_named_and_keeps_every_generation(tmp_path, name, content, capsys):
    out, victim = tmp_path / "ds", tmp_path / "victim"
    victim.mkdir()
    (victim / "mine.txt").write_text("mine")
    _build(out, GENS[:3], keep=2)
    (out / ".refs").mkdir()
    (out / ".refs" / name).write_bytes(content)
    assert cli.main(["gc", str(out), "--keep-generations", "0", "--yes"]) == 0
    text = capsys.readouterr().out
    assert f"damaged ref .refs/{name}" in text and "\x1b" not in text
    assert _dirs(out) == GENS[:3] and (out / ".refs" / name).exists() and (victim / "mine.txt").exists()


def test_a_stale_refs_holder_is_never_touched_and_a_live_holder_keeps_its_generation(tmp_path):
    out, holder = tmp_path / "ds", tmp_path / "victim"
    holder.mkdir()
    (holder / "mine.txt").write_text("mine")
    _build(out, GENS[:2], keep=0)
    _ref(out, GENS[1], holder, kind="export")
    _commit(out, GENS[2], GENS[1], keep=0)
    result = gc(str(out), keep_generations=0, yes=True)
    assert _dirs(out) == GENS[1:3] and result.plan.remove == [] and (holder / "mine.txt").exists()


def test_gc_of_a_directory_that_is_not_a_dataset_exits_2_naming_it(tmp_path, capsys):
    (tmp_path / "plain").mkdir()
    assert cli.main(["gc", str(tmp_path / "plain")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a dataset" in err and "plain" in err
    store = tmp_path / "db"
    store.mkdir()
    (store / "manifest.json").write_text(json.dumps({"format": "pileprep.retrieval_db", "generation": GENS[0]}))
    assert cli.main(["gc", str(store)]) == 2
    assert "retrieval-db" in capsys.readouterr().err


def test_parse_ref_round_trips_and_refuses_a_copied_ref():
    ref = refs.Ref(GENS[0], "sidecar", "/data/sidecar", 12.5)
    assert refs.parse_ref(ref.file_name(), ref.to_json().encode()) == ref
    other = refs.ref_file_name("sidecar", "/data/other")
    with pytest.raises(refs.RefError, match="does not match its holder"):
        refs.parse_ref(other, ref.to_json().encode())


def test_pinning_moves_to_a_generation_committed_between_the_read_and_the_ref(tmp_path, monkeypatch):
    out, holder = tmp_path / "ds", tmp_path / "ck"
    _build(out, GENS[:1])
    real_write = refs.write_ref_local
    calls = []

    def write_after_a_commit(dataset, ref):
        if not calls:  # a commit lands after the trainer read A, before its ref: that commit cannot see it
            _commit(out, GENS[1], GENS[0], keep=0)
        calls.append(ref.generation)
        return real_write(dataset, ref)

    monkeypatch.setattr(refs, "write_ref_local", write_after_a_commit)
    assert refs.pin_generation(str(out), str(holder)) == GENS[1]
    assert calls == [GENS[0], GENS[1]]
    (ref_file,) = (out / ".refs").iterdir()
    assert refs.parse_ref(ref_file.name, ref_file.read_bytes()).generation == GENS[1]


def test_the_trainer_reads_its_pinned_generation_or_refuses_naming_it(tmp_path, monkeypatch):
    from trainer.config import DataConfig
    from trainer.dataset import pin_generation, read_manifest

    monkeypatch.delenv("RANK", raising=False)
    out, ck = tmp_path / "ds", tmp_path / "ck"
    _build(out, GENS[:1])
    cfg = DataConfig(path=str(out))
    assert pin_generation(cfg, str(ck), None) == GENS[0]
    (ref_file,) = (out / ".refs").iterdir()
    assert json.loads(ref_file.read_text())["holder"] == os.path.abspath(ck)
    _commit(out, GENS[1], GENS[0], keep=0)  # the ref keeps A
    manifest, mfile = read_manifest(cfg, GENS[0])
    assert manifest.generation == GENS[0] and mfile == str(out / "manifest.json")  # shards resolve from the root
    assert pin_generation(cfg, str(ck), GENS[0]) == GENS[0]  # a resume on A
    ref_file.unlink()
    _commit(out, GENS[2], GENS[1], keep=0)  # nothing keeps A now
    with pytest.raises(FileNotFoundError, match=GENS[0]):
        pin_generation(cfg, str(ck), GENS[0])
    with pytest.raises(ContractError):
        pin_generation(cfg, str(ck), "../elsewhere")


def test_export_registers_a_ref_to_the_generation_it_reads(tmp_path):
    from pipeline.tools.export import register_export

    out = tmp_path / "ds"
    _build(out, GENS[:1])
    manifest = register_export(str(out), str(tmp_path / "pq"))
    assert isinstance(manifest, Manifest) and manifest.generation == GENS[0]
    (ref_file,) = (out / ".refs").iterdir()
    ref = refs.parse_ref(ref_file.name, ref_file.read_bytes())
    assert (ref.kind, ref.generation, ref.holder) == ("export", GENS[0], str(tmp_path / "pq"))
    assert not (out / ".pileprep.lock").exists()  # written under the lock, released after
    _commit(out, GENS[1], GENS[0], keep=0)
    assert _dirs(out) == GENS[:2]
    assert load_manifest(str(out / "generations" / f"{GENS[0]}.manifest.json")).generation == GENS[0]


def test_a_staging_dir_inside_generations_or_refs_is_refused(tmp_path):
    from pipeline.errors import ConfigError

    for inner in ("generations", ".refs/x"):
        with pytest.raises(ConfigError, match="--staging-dir"):
            commit.check_staging_dir(str(tmp_path / "ds"), str(tmp_path / "ds" / inner))


def test_ranks_that_read_different_generations_refuse_naming_both(tmp_path):
    import torch.multiprocessing as mp

    from tests.generation_ranks import rank_generation

    mp.start_processes(rank_generation, args=(str(tmp_path / "store"), str(tmp_path), GENS[:2]), nprocs=2,
                       join=True, start_method="fork")  # forked: the ranks need not import torch again
    for rank in (0, 1):
        text = (tmp_path / f"rank{rank}").read_text()
        assert "different generations" in text and GENS[0] in text and GENS[1] in text, text


def test_a_rebuild_named_like_a_kept_previous_generation_takes_another_name(tmp_path):
    from types import SimpleNamespace

    from pipeline.config import ShardConfig
    from pipeline.shard.plan import generation_name
    from transforms.shard.records import LedgerEntry

    out = tmp_path / "ds"
    config = ShardConfig(inputs=("in/*.jsonl",), output=str(out), tokenizer="t.model")
    contract = SimpleNamespace(tokenizer=SimpleNamespace(model_sha256="0" * 64))
    ledger = [LedgerEntry("in/a.jsonl", 10)]
    fresh = generation_name(config, contract, ledger, None, False)
    _build(out, [GENS[0]])
    live = commit.read_committed(str(out))
    assert generation_name(config, contract, ledger, live, False) == fresh  # nothing kept under that name
    (out / "generations" / f"{fresh}.manifest.json").write_text(make_manifest(fresh, [make_shard(fresh)]).to_json())
    renamed = generation_name(config, contract, ledger, live, False)
    assert renamed != fresh and renamed != GENS[0]  # never rewrite a kept generation a trainer may be reading


def test_gc_on_s3_removes_an_unkept_generation_and_keeps_a_ref_named_one(tmp_path, s3_server, capsys):  # noqa: F811
    out = tmp_path / "ds"
    _build(out, GENS[:3], keep=2)
    _ref(out, GENS[0], "s3://elsewhere/export")  # an object-store holder: never judged stale
    client = s3_server.client()
    client.create_bucket(Bucket="gcb")
    for p in out.rglob("*"):
        if p.is_file():
            client.upload_file(str(p), "gcb", f"ds/{p.relative_to(out)}")
    args = ["gc", "s3://gcb/ds", "--keep-generations", "0", "--yes", *s3_server.beam_args(),
            "--s3_access_key_id=testing", "--s3_secret_access_key=testing"]

    def keys():
        return sorted(o["Key"] for o in client.list_objects_v2(Bucket="gcb", Prefix="ds/").get("Contents", []))

    assert cli.main(args) == 0, capsys.readouterr().err
    assert f"removed {GENS[1]}" in capsys.readouterr().out
    left = keys()
    assert [k for k in left if "gen-" in k] == [  # B gone (directory and its manifest), A kept by the ref
        f"ds/{g}/train-00000-of-00001.tfrecord" for g in (GENS[0], GENS[2])] + [
        f"ds/generations/{g}.manifest.json" for g in (GENS[0], GENS[2])]
    assert "ds/.pileprep.lock" not in left and len([k for k in left if k.startswith("ds/.refs/")]) == 1
