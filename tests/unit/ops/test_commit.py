"""pipeline/ops/commit.py: shards durable before the manifest, nothing outside the output deleted, unique temp names."""
from __future__ import annotations

import pytest

from model_contract import ContractError, Manifest
from pipeline.ops import commit
from transforms.io import io_utils
from tests.manifest_fixtures import GEN_A, GEN_B, make_manifest, make_shard


def test_new_shards_are_fsynced_before_the_manifest_is_published(tmp_path, monkeypatch):
    out = tmp_path / "ds"
    (out / GEN_A).mkdir(parents=True)
    (out / GEN_A / "train-00000-of-00001.tfrecord").write_bytes(b"x")
    events = []
    real_fsync, real_publish = io_utils.fsync_files, commit.publish_manifest
    monkeypatch.setattr(io_utils, "fsync_files",
                        lambda paths: (events.append(("fsync", sorted(map(str, paths)))), real_fsync([]))[1])
    monkeypatch.setattr(commit, "publish_manifest",
                        lambda *a, **k: (events.append(("publish",)), real_publish(*a, **k))[1])
    commit.commit_dataset(str(out), make_manifest(GEN_A, [make_shard(GEN_A)]), None, str(out / "_staging" / GEN_A))
    assert [e[0] for e in events] == ["fsync", "publish"]
    assert events[0][1] == [str(out / GEN_A / "train-00000-of-00001.tfrecord")]


def test_a_manifest_naming_outside_directories_deletes_nothing(tmp_path):
    out, victim, victim2 = tmp_path / "out", tmp_path / "victim", tmp_path / "victim2"
    for d in (out / GEN_A, out / GEN_B, victim, victim2):
        d.mkdir(parents=True)
        (d / "keep.txt").write_text("mine")
        (d / "train-00000-of-00001.tfrecord").write_bytes(b"x")
    previous = make_manifest(GEN_A, [make_shard(GEN_A)])
    previous.generations += [{"name": str(victim)}, {"name": "../victim2"}]  # as if loaded without validation
    (out / "manifest.json").write_text(previous.to_json())
    with pytest.raises(ContractError, match=r"generations\[1\]\.name"):
        commit.read_committed(str(out))
    (out / "manifest.json").write_text(make_manifest(GEN_A, [make_shard(GEN_A)]).to_json())
    commit.commit_dataset(str(out), make_manifest(GEN_B, [make_shard(GEN_B)]), GEN_A, str(out / "_staging" / GEN_B),
                          previous=previous, keep_generations=0)  # no previous generation kept: A goes now
    assert (victim / "keep.txt").exists() and (victim2 / "keep.txt").exists()
    assert not (out / GEN_A).exists() and (out / GEN_B).exists()


@pytest.mark.parametrize("staging", ["{out}", "{tmp}", "{out}/" + GEN_A, "{out}/" + GEN_A + "/x"])
def test_a_staging_dir_that_could_delete_the_dataset_is_refused(tmp_path, staging, capsys):
    from pipeline.cli import main as cli_main
    from tests.ops_fixtures import tokenizer_path

    out = tmp_path / "out"
    staging = staging.format(out=out, tmp=tmp_path)
    rc = cli_main(["shard", "--input", str(tmp_path / "*.jsonl"), "--output", str(out), "--tokenizer",
                   tokenizer_path(), "--staging-dir", staging])
    err = capsys.readouterr().err
    assert rc == 2 and "--staging-dir" in err and len(err.strip().splitlines()) == 1, err
    commit.check_staging_dir(str(out), str(out / "_staging"))  # the default is fine
    commit.check_staging_dir(str(out), str(tmp_path / "elsewhere"))


def test_the_commit_never_deletes_a_path_the_new_manifest_references(tmp_path):
    out = tmp_path / "out"
    (out / GEN_A).mkdir(parents=True)
    (out / GEN_A / "train-00000-of-00001.tfrecord").write_bytes(b"x")
    with pytest.raises(RuntimeError, match="references"):
        commit.commit_dataset(str(out), make_manifest(GEN_A, [make_shard(GEN_A)]), None, str(out / GEN_A))
    assert (out / GEN_A / "train-00000-of-00001.tfrecord").exists() and not (out / "manifest.json").exists()


def test_the_manifest_temp_file_has_a_unique_name(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json.tmp").write_text("a user's file")
    commit.publish_manifest(str(out), make_manifest(GEN_A, [make_shard(GEN_A)]).to_json())
    assert (out / "manifest.json.tmp").read_text() == "a user's file"
    assert Manifest.from_json((out / "manifest.json").read_text()).generation == GEN_A
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "manifest.json.tmp"]


def test_a_killed_attempts_temp_file_in_the_new_generation_is_not_committed(tmp_path):
    """Spark and Flink re-execute a bundle whose worker was killed mid-write: the retry's file is renamed into place,
    the killed attempt's temp file stays behind. The commit removes it; a user's look-alike elsewhere is kept."""
    out = tmp_path / "out"
    (out / GEN_A / "sub").mkdir(parents=True)
    (out / GEN_A / "train-00000-of-00001.tfrecord").write_bytes(b"x")
    killed = [out / GEN_A / ".train-00000-of-00001.tfrecord.0123456789ab.part",
              out / GEN_A / "sub" / ".f000000-read.jsonl.abcdef012345.tmp"]
    for p in killed:
        p.write_bytes(b"half")
    (out / GEN_A / "notes.0123456789ab.part").write_bytes(b"not a temp name: no leading dot")
    (tmp_path / ".mine.0123456789ab.part").write_bytes(b"outside the output")
    commit.commit_dataset(str(out), make_manifest(GEN_A, [make_shard(GEN_A)]), None, str(out / "_staging" / GEN_A))
    assert [p for p in killed if p.exists()] == []
    assert (out / GEN_A / "notes.0123456789ab.part").exists() and (tmp_path / ".mine.0123456789ab.part").exists()
    assert (out / GEN_A / "train-00000-of-00001.tfrecord").read_bytes() == b"x"
