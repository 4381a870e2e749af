"""The one job runner (pipeline/job.py) for every job that commits an output: the shard job, `retrieval build`
and `retrieval neighbours` get one lock, one cleanup of what crashed runs left, one interrupt line and one
commit protocol with output kinds (pipeline/ops/commit.py). Real Beam runs and real signals; the tiny
tokenizer trained in the tests, so nothing here needs ../shared/data."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pipeline.config import ShardConfig
from pipeline.ops import guards, lock
from pipeline.retrieval import build, neighbours
from pipeline.retrieval.config import BuildConfig, NeighboursConfig
from pipeline.shard import shard_pipeline
from tests.conftest import REPO
from tests.corpus_fixtures import write_good_corpus
from tests.ops_fixtures import dataset_files, kill_group, run_cli, subprocess_env

IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
SEQ_LEN = 128
CHUNK = 32


def _shard_cli(corpus, out, tokenizer, *extra) -> list:
    return ["shard", "--input", str(corpus / "*"), "--output", str(out), "--tokenizer", tokenizer, "--seq-len",
            str(SEQ_LEN), "--num-shards", "2", "--val-fraction", "0.1", "--test-fraction", "0", "--unit-mb", "0.05",
            "--progress-every", "0", *extra]


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("jcorpus")
    write_good_corpus(root, limit_bytes=160_000, files=2)
    return root


@pytest.fixture(scope="module")
def dataset(corpus, tiny_tokenizer, tmp_path_factory):
    out = tmp_path_factory.mktemp("jds") / "ds"
    shard_pipeline.run(ShardConfig(inputs=(str(corpus / "*"),), output=str(out), tokenizer=tiny_tokenizer,
                                   seq_len=SEQ_LEN, num_shards=2, val_fraction=0.1, test_fraction=0.0,
                                   unit_mb=0.05), IN_MEMORY)
    return out


@pytest.fixture(scope="module")
def db(dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("jdb") / "db"
    build.run(BuildConfig(dataset=str(dataset), output=str(out), chunk_len=CHUNK, num_db_shards=2), IN_MEMORY)
    return out


# ------------------------------------------------------------------------------------------ output kinds
@pytest.mark.parametrize("target", ["the input dataset", "another committed dataset"])
def test_neighbours_into_a_committed_dataset_is_refused_and_the_dataset_is_untouched(dataset, db, tmp_path, target):
    """Into its own --dataset: refused as an output overlapping an input (review33, pipeline/retrieval/config.py);
    into another committed dataset: refused as an output holding another kind (pipeline/job.py)."""
    import shutil

    out = dataset
    if target == "another committed dataset":
        out = tmp_path / "other"
        shutil.copytree(dataset, out, symlinks=True)
    before = dataset_files(out)
    res = run_cli(["retrieval", "neighbours", "--dataset", str(dataset), "--db", str(db), "--output", str(out),
                   "--neighbour-len", str(2 * CHUNK), *IN_MEMORY], timeout_s=120)
    line = _one_line(res.stderr)
    said = "overlaps --dataset" if out == dataset else "holds a dataset"
    assert res.returncode == 2 and f"--output {out}" in line and said in line, res.stderr
    assert dataset_files(out) == before


def test_the_manifest_records_each_outputs_kind(dataset, db):
    assert json.loads((dataset / "manifest.json").read_text())["kind"] == "dataset"
    assert json.loads((db / "manifest.json").read_text())["kind"] == "retrieval-db"


def test_a_directory_of_files_pileprep_did_not_create_is_refused(dataset, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    res = run_cli(["retrieval", "build", "--dataset", str(dataset), "--output", str(out), "--chunk-len",
                   str(CHUNK), *IN_MEMORY], timeout_s=120)
    line = _one_line(res.stderr)
    assert res.returncode == 2 and "notes.txt" in line and "did not create" in line, res.stderr
    assert sorted(os.listdir(out)) == ["notes.txt"] and (out / "notes.txt").read_text() == "my notes"


# ------------------------------------------------------------------------------------------ one writer
def test_a_second_retrieval_build_on_a_locked_output_refuses_in_one_line(dataset, db, tmp_path):
    import shutil

    out = tmp_path / "db"
    shutil.copytree(db, out)
    before = dataset_files(out)
    held = lock.OutputLock(str(out))  # a live run on this host holds the output (this test's process)
    with held.held():
        res = run_cli(["retrieval", "build", "--dataset", str(dataset), "--output", str(out), "--chunk-len", "16",
                       *IN_MEMORY], timeout_s=120)
    line = _one_line(res.stderr)
    assert res.returncode == 2 and "output is locked by" in line and f"pid {os.getpid()}" in line, res.stderr
    assert dataset_files(out) == before


# ------------------------------------------------------------------------------------------ interrupts
def _generation_dirs(root) -> list:
    return sorted(p.name for p in root.glob("gen-*"))


def _plant_a_crashed_runs_leftovers(out, name: str) -> None:
    """A partial generation holding `name` and its marked staging directory, as a crashed run leaves them."""
    (out / "gen-0123456789abcdef").mkdir(parents=True, exist_ok=True)
    (out / "gen-0123456789abcdef" / name).write_bytes(b"partial")
    guards.mark_staging(str(out / "_staging" / "gen-0123456789abcdef"), str(out), "gen-0123456789abcdef")


def _sigterm_once_staging(args: list, out) -> tuple:
    """`pileprep ARGS` (the default local runner) sent SIGTERM 0.2 s after its staging appears under `out`, inside
    the job (its SIGTERM handler is in place before the staging is made: pipeline/job.py run_job), before its
    commit (a neighbours job of this size commits ~0.75 s after): (exit status, stderr)."""
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=subprocess_env(PYTHONPATH=str(REPO)), cwd=str(REPO),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and not any((out / "_staging").glob("gen-*")):
            time.sleep(0.005)
        time.sleep(0.2)  # the pipeline is starting or running
        assert proc.poll() is None, "finished before the signal"
        os.kill(proc.pid, signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    return proc.returncode, err.decode(errors="replace")


def test_sigterm_during_retrieval_build_is_one_line_and_the_next_run_cleans_up(dataset, db, tmp_path):
    import shutil

    out = tmp_path / "db"
    shutil.copytree(db, out)
    committed = json.loads((out / "manifest.json").read_text())["generation"]
    before = dataset_files(out)
    # The default local runner (worker threads in the driver), a build of another generation (--chunk-len 16).
    returncode, err = _sigterm_once_staging(["retrieval", "build", "--dataset", str(dataset), "--output", str(out),
                                             "--chunk-len", "16", "--num-db-shards", "2"], out)
    assert returncode == 143 and _one_line(err) == "pileprep: interrupted; previous chunk database intact", err
    assert (out / "manifest.json").read_bytes() == before["manifest.json"]
    # Whatever the interrupted run (or a crashed one) left, the next run on this output removes under the lock.
    _plant_a_crashed_runs_leftovers(out, "x.parquet")
    res = run_cli(["retrieval", "build", "--dataset", str(dataset), "--output", str(out), "--chunk-len", str(CHUNK),
                   "--num-db-shards", "2", *IN_MEMORY], timeout_s=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _generation_dirs(out) == [committed] and not any((out / "_staging").glob("gen-*"))
    assert dataset_files(out) == before  # the same database again (nothing to do), nothing else left


KILL_AT_MANIFEST_REPLACE = """
import os, signal, sys
real_replace = os.replace
def replace(src, dst, *a, **k):
    if os.path.basename(str(dst)) == "manifest.json":  # not generations/<gen>.manifest.json, written before it
        os.kill(os.getpid(), signal.SIGKILL)  # the commit point: the temp manifest is written and fsynced
    return real_replace(src, dst, *a, **k)
os.replace = replace
from pipeline.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_sigkill_at_the_shard_commit_leaves_a_temp_manifest_the_next_run_removes(corpus, tiny_tokenizer,
                                                                                   tmp_path):
    out = tmp_path / "out"
    args = _shard_cli(corpus, out, tiny_tokenizer, *IN_MEMORY)
    killed = subprocess.run([sys.executable, "-c", KILL_AT_MANIFEST_REPLACE, *args], capture_output=True,
                            env=subprocess_env(PYTHONPATH=str(REPO)), cwd=str(REPO), timeout=300)
    assert killed.returncode == -signal.SIGKILL
    temps = [p.name for p in out.iterdir() if p.name.startswith(".manifest.json.")]
    assert len(temps) == 1 and not (out / "manifest.json").exists()
    res = run_cli(args, timeout_s=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert not [p for p in out.iterdir() if p.name.startswith(".manifest.json.")]
    assert (out / "manifest.json").exists() and not (out / lock.LOCK_NAME).exists()


def test_a_sigkill_at_the_retrieval_build_commit_leaves_a_temp_manifest_the_next_run_removes(dataset, tmp_path):
    """The retrieval build commits by the shard job's protocol (pipeline/job.py): killed at its manifest's rename,
    it leaves the temporary manifest and its lock; the next run on the output removes both, under the lock."""
    out = tmp_path / "db"
    args = ["retrieval", "build", "--dataset", str(dataset), "--output", str(out), "--chunk-len", str(CHUNK),
            "--num-db-shards", "2", *IN_MEMORY]
    killed = subprocess.run([sys.executable, "-c", KILL_AT_MANIFEST_REPLACE, *args], capture_output=True,
                            env=subprocess_env(PYTHONPATH=str(REPO)), cwd=str(REPO), timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    temps = [p.name for p in out.iterdir() if p.name.startswith(".manifest.json.")]
    assert len(temps) == 1 and not (out / "manifest.json").exists() and (out / lock.LOCK_NAME).exists()
    # The next run in this process (the dead holder's lock is stale at once on this host): seconds, not a new
    # interpreter's imports.
    build.run(BuildConfig(dataset=str(dataset), output=str(out), chunk_len=CHUNK, num_db_shards=2), IN_MEMORY)
    assert not [p for p in out.iterdir() if p.name.startswith(".manifest.json.")]
    assert json.loads((out / "manifest.json").read_text())["kind"] == "retrieval-db"
    assert not (out / lock.LOCK_NAME).exists()


@pytest.fixture(scope="module")
def sidecar(dataset, db, tmp_path_factory):
    out = tmp_path_factory.mktemp("jnb") / "nb"
    neighbours.run(NeighboursConfig(dataset=str(dataset), db=str(db), output=str(out), neighbour_len=2 * CHUNK),
                   IN_MEMORY)
    return out


def test_sigterm_during_retrieval_neighbours_is_one_line_and_the_next_run_cleans_up(dataset, db, sidecar, tmp_path):
    import shutil

    out = tmp_path / "nb"
    shutil.copytree(sidecar, out)
    committed = json.loads((out / "manifest.json").read_text())["generation"]
    before = dataset_files(out)
    # The default local runner, neighbours of another generation (--neighbour-len CHUNK).
    returncode, err = _sigterm_once_staging(["retrieval", "neighbours", "--dataset", str(dataset), "--db", str(db),
                                             "--output", str(out), "--neighbour-len", str(CHUNK)], out)
    assert returncode == 143 and _one_line(err) == "pileprep: interrupted; previous sidecar intact", err
    assert (out / "manifest.json").read_bytes() == before["manifest.json"] and not (out / lock.LOCK_NAME).exists()
    # Whatever the interrupted run (or a crashed one) left, the next run on this output removes under the lock.
    _plant_a_crashed_runs_leftovers(out, "x.tfrecord")
    neighbours.run(NeighboursConfig(dataset=str(dataset), db=str(db), output=str(out), neighbour_len=2 * CHUNK),
                   IN_MEMORY)
    assert _generation_dirs(out) == [committed] and not any((out / "_staging").glob("gen-*"))
    assert dataset_files(out) == before  # the same sidecar again (nothing to do), nothing else left


# ------------------------------------------------------------------------------------------ staging
def test_two_outputs_sharing_a_staging_dir_get_their_own_staging(corpus, tiny_tokenizer, tmp_path):
    staging = tmp_path / "staging"

    def plan(name):
        return shard_pipeline.prepare(ShardConfig(inputs=(str(corpus / "*"),), output=str(tmp_path / name),
                                                  tokenizer=tiny_tokenizer, seq_len=SEQ_LEN,
                                                  staging_dir=str(staging)))

    a, b = plan("a"), plan("b")
    assert a.generation == b.generation  # same config and inputs: the same generation name
    assert a.staging_dir != b.staging_dir and all(p.startswith(str(staging) + "/") for p in (a.staging_dir,
                                                                                             b.staging_dir))
    # a crashed run of output a leaves its staging; a run of output b on the same root leaves it alone
    guards.mark_staging(a.staging_dir, str(tmp_path / "a"), a.generation)
    assert guards.cleanup_abandoned(str(tmp_path / "b"), str(staging), None) == []
    assert guards.cleanup_abandoned(str(tmp_path / "a"), str(staging), None) == [a.staging_dir]


def test_a_committed_run_leaves_no_empty_staging_root_but_never_removes_a_given_staging_dir(corpus, tiny_tokenizer,
                                                                                           tmp_path):
    def run(output, staging_dir=None):
        shard_pipeline.run(ShardConfig(inputs=(str(corpus / "*"),), output=str(output), tokenizer=tiny_tokenizer,
                                       seq_len=SEQ_LEN, staging_dir=staging_dir), IN_MEMORY, progress_every_s=0)

    run(tmp_path / "out")
    assert (tmp_path / "out" / "manifest.json").exists() and not (tmp_path / "out" / "_staging").exists()
    staging = tmp_path / "mine"
    staging.mkdir()
    run(tmp_path / "out2", str(staging))
    assert staging.is_dir() and list(staging.iterdir()) == []  # the user's directory: emptied of ours, kept
