"""A run killed at any moment leaves the previous complete dataset (or nothing) visible, and a
re-run after the crash gives the same bytes as a run that never crashed.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from model_contract import load_manifest, resolve_shard_path
from pipeline.ops import commit
from transforms.io import io_utils
from tests.conftest import REPO
from tests.ops_fixtures import FAST_LOCAL, dataset_files, kill_group, real_corpus, run_cli, shard_args, subprocess_env

pytestmark = pytest.mark.timeout(240)


def _committed_generation(output_dir: str):
    """The live manifest's generation (None: nothing committed), read as every command reads it."""
    m = commit.read_committed(output_dir)
    return None if m is None else m.generation


def _start(args):
    return subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=subprocess_env(PYTHONPATH=str(REPO)), cwd=str(REPO),
                            start_new_session=True)


def _kill_when(proc, predicate, timeout_s=120.0) -> bool:
    """SIGKILL the job's whole process group as soon as `predicate()` holds; False if it finished first."""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            if predicate():
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
                return True
            time.sleep(0.01)
        pytest.fail("the job neither reached the kill point nor finished")
    finally:
        kill_group(proc)
        if proc.stderr:
            proc.stderr.close()


def _verify_visible_dataset(out):
    """What a trainer would read: the manifest and every shard it lists, complete and checksummed."""
    manifest_file = out / "manifest.json"
    m = load_manifest(str(manifest_file))
    for s in m.shards:
        data = open(resolve_shard_path(str(manifest_file), s), "rb").read()
        assert len(data) == s.bytes and hashlib.sha256(data).hexdigest() == s.sha256
    return m


def _spill_written(out):
    return lambda: any(p.is_file() for p in (out / "_staging").rglob("units/*"))


def _shard_written(out, known):
    """A shard of the new generation is on disk. By path, not name: each generation has its own folder and the
    same names (train-00000-of-00002) recur, so a name test fired only when the new data happened to give a
    split another shard count (a hash-split matter; the generated stand-in's did not)."""
    return lambda: any(str(p.relative_to(out)) not in known for p in out.glob("gen-*/*.tfrecord"))


@pytest.mark.parametrize("kill_point", ["spill", "shards"])
def test_killed_run_leaves_previous_dataset_and_rerun_gives_same_bytes(tmp_path, kill_point):
    corpus = real_corpus(tmp_path / "corpus")
    files = sorted(corpus.iterdir())
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    for p in files[:2]:
        shutil.copy(p, inbox / p.name)
    out = tmp_path / "out"
    inputs = [str(inbox / "*")]

    # 1. A first run killed before its commit: nothing visible.
    if kill_point == "spill":
        proc = _start(shard_args(inputs, out, "--incremental", "--unit-mb", "0.05", *FAST_LOCAL))
        assert _kill_when(proc, _spill_written(out)), "the job finished before the kill point"
        assert not (out / "manifest.json").exists()

    # 2. Re-run it: committed.
    res = run_cli(shard_args(inputs, out, "--incremental", "--unit-mb", "0.05", *FAST_LOCAL), timeout_s=150)
    assert res.returncode == 0, res.stderr[-3000:]
    before = (out / "manifest.json").read_bytes()
    _verify_visible_dataset(out)

    # 3. New input arrives; the incremental run is killed mid-write.
    for p in files[2:]:
        shutil.copy(p, inbox / p.name)
    known = {str(p.relative_to(out)) for p in out.glob("gen-*/*.tfrecord")}
    predicate = _spill_written(out) if kill_point == "spill" else _shard_written(out, known)
    proc = _start(shard_args(inputs, out, "--incremental", "--unit-mb", "0.05", *FAST_LOCAL))
    assert _kill_when(proc, predicate), "the job finished before the kill point"
    assert (out / "manifest.json").read_bytes() == before  # the previous dataset, untouched
    assert len(_verify_visible_dataset(out).shards) == len(json.loads(before)["shards"])

    # 4. Re-run after the crash, and compare with a twin that never crashed (fast in-process runner: the
    #    output is byte-identical across runners).
    res = run_cli(shard_args(inputs, out, "--incremental", "--unit-mb", "0.05", *FAST_LOCAL), timeout_s=150)
    assert res.returncode == 0, res.stderr[-3000:]
    # The twin reads the very same input files (paths and mtimes are in the ledger): move the new ones aside
    # (rename keeps mtime), build generation 1, move them back, build generation 2.
    twin_out, aside = tmp_path / "twin-out", tmp_path / "aside"
    aside.mkdir()
    for p in files[2:]:
        os.rename(inbox / p.name, aside / p.name)
    assert run_cli(shard_args(inputs, twin_out, "--incremental", "--unit-mb", "0.05", *FAST_LOCAL),
                   timeout_s=150).returncode == 0
    for p in files[2:]:
        os.rename(aside / p.name, inbox / p.name)
    assert run_cli(shard_args(inputs, twin_out, "--incremental", "--unit-mb", "0.05", *FAST_LOCAL),
                   timeout_s=150).returncode == 0
    got, want = dataset_files(out), dataset_files(twin_out)
    assert got.keys() == want.keys()
    assert [k for k in got if got[k] != want[k]] == []  # shards, dead letters and manifest: same bytes
    assert len(json.loads(got["manifest.json"])["generations"]) == 2
    assert not any((out / "_staging").rglob("*.*"))  # staging cleaned after the commit


# ------------------------------------------------------------------------------------- commit unit tests
GEN_A, GEN_B, GEN_C = ("gen-" + c * 16 for c in "abc")

def _manifest(tmp_path, generation):
    from model_contract import DataContract, Manifest, ShardInfo

    src = json.loads((tmp_path / "seed.json").read_text()) if (tmp_path / "seed.json").exists() else None
    m = Manifest.from_dict(src)
    m.generation, m.generations = generation, [{"name": generation}]
    m.shards = [ShardInfo(f"{generation}/train-00000-of-00001.tfrecord", "train", 1, 1, 0, 1, 1, "0" * 64)]
    return m, DataContract


@pytest.fixture(scope="module")
def seed_manifest(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("seed")
    corpus = real_corpus(tmp_path / "corpus", names=("pile/val.jsonl.zst",))
    res = run_cli(shard_args([str(corpus / "*")], tmp_path / "seed", *FAST_LOCAL), timeout_s=120)
    assert res.returncode == 0, res.stderr[-2000:]
    (tmp_path / "seed.json").write_bytes((tmp_path / "seed" / "manifest.json").read_bytes())
    return tmp_path


def test_commit_refuses_when_another_run_committed_meanwhile_and_gc_keeps_referenced(seed_manifest, tmp_path):
    out = tmp_path / "ds"
    tmp_path = seed_manifest
    for gen in (GEN_A, GEN_B, GEN_C):
        (out / gen).mkdir(parents=True)
        (out / gen / "train-00000-of-00001.tfrecord").write_bytes(b"x")
    m_a, _ = _manifest(tmp_path, GEN_A)
    commit.commit_dataset(str(out), m_a, None, str(out / "_staging" / GEN_A))
    m_b, _ = _manifest(tmp_path, GEN_B)
    # A run that started before gen-a was committed must not overwrite it.
    with pytest.raises(commit.ConcurrentCommitError, match=GEN_A):
        commit.commit_dataset(str(out), m_b, None, str(out / "_staging" / GEN_B))
    assert _committed_generation(str(out)) == GEN_A
    # A full rebuild replacing gen-a, keeping no previous generation: gen-a is collected after the commit,
    # gen-c (never committed: maybe a concurrent run's, in flight) is left alone.
    commit.commit_dataset(str(out), m_b, GEN_A, str(out / "_staging" / GEN_B), previous=m_a, keep_generations=0)
    assert _committed_generation(str(out)) == GEN_B
    assert not (out / GEN_A).exists() and (out / GEN_B).exists() and (out / GEN_C).exists()
    # Beam retrying the commit bundle: publishing the same manifest again is a no-op.
    commit.commit_dataset(str(out), m_b, GEN_A, str(out / "_staging" / GEN_B), previous=m_a)
    assert _committed_generation(str(out)) == GEN_B


def test_manifest_replace_is_atomic_a_crash_before_rename_leaves_old_manifest(seed_manifest, tmp_path, monkeypatch):
    out = tmp_path / "ds"
    tmp_path = seed_manifest
    m_a, _ = _manifest(tmp_path, GEN_A)
    commit.publish_manifest(str(out), m_a.to_json())
    old = (out / "manifest.json").read_bytes()
    m_b, _ = _manifest(tmp_path, GEN_B)

    def crash(*_a, **_k):
        raise KeyboardInterrupt("killed between the temp write and the rename")

    monkeypatch.setattr(io_utils.os, "replace", crash)  # the rename inside io_utils.replace_atomically
    with pytest.raises(KeyboardInterrupt):
        commit.publish_manifest(str(out), m_b.to_json())
    assert (out / "manifest.json").read_bytes() == old
