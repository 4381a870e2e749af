"""A trainer started on generation A keeps training while `pileprep shard` commits generation B into the same
dataset; `pileprep gc` removes A only once the trainer's ref (its checkpoint directory) is gone.

Real parts: the `pileprep` CLI on real sample files (FnApiRunner), the trainer under real torchrun (gloo, CPU).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from model_contract import load_manifest
from pipeline import cli
from tests.conftest import REPO
from tests.ops_fixtures import FAST_LOCAL, kill_group, real_corpus, run_cli, shard_args
from tests.trainer_launch import TINY, command, env, read_metrics

pytestmark = pytest.mark.timeout(420)
STEPS, PAUSE = 6, 2


def test_a_trainer_keeps_its_generation_while_another_commits_and_gc_removes_it_after_its_ref(tmp_path, capsys):
    corpus = real_corpus(tmp_path / "a", names=("other/dolma-cc_en_head-0091.jsonl.gz",))
    more = real_corpus(tmp_path / "b", names=("other/enron_examples.jsonl",))
    out, ck, release = tmp_path / "ds", tmp_path / "ck", tmp_path / "release"
    res = run_cli(shard_args([str(corpus / "*")], out, *FAST_LOCAL), timeout_s=150)
    assert res.returncode == 0, res.stderr[-2000:]
    a = load_manifest(str(out))
    sizes_a = {s.path: s.bytes for s in a.shards}

    trainer = subprocess.Popen(
        command(1, ["--data", str(out), *TINY, "--steps", str(STEPS), "--checkpoint-dir", str(ck),
                    "--metrics-file", str(tmp_path / "m.jsonl"), "--log-every", "1"]),
        cwd=REPO, env=env({"wait_after_step": [PAUSE, str(release)]}), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "release.reached").exists() and trainer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "release.reached").exists(), trainer.communicate(timeout=30)[0].decode()[-3000:]
        # B (one more input file: a new generation, same configuration) commits mid-run, keeping no previous
        # generation: only the trainer's ref keeps A.
        b_args = shard_args([str(corpus / "*"), str(more / "*")], out, "--keep-generations", "0", *FAST_LOCAL)
        res = run_cli(b_args, timeout_s=150)
        assert res.returncode == 0, res.stderr[-2000:]
        b = load_manifest(str(out))
        assert b.generation != a.generation
        for path, size in sizes_a.items():
            assert (out / path).stat().st_size == size, path
        # The next run on this output cleans up at start-up: a kept generation is not an interrupted run's garbage.
        res = run_cli(b_args, timeout_s=150)
        assert res.returncode == 0 and "nothing to do" in res.stdout and (out / a.generation).is_dir(), res.stderr
        release.touch()
        log = trainer.communicate(timeout=180)[0].decode()
    finally:
        kill_group(trainer)
    assert trainer.returncode == 0, log[-4000:]
    assert [r["step"] for r in read_metrics(tmp_path / "m.jsonl") if "loss" in r][-1] == STEPS
    (meta,) = [json.loads(p.read_text()) for p in ck.glob("step_*/meta.json") if f"{STEPS:08d}" in p.parent.name]
    assert meta["generation"] == a.generation  # it trained on A to the end, B live since step 2

    # gc in this process (the CLI's own entry point; the whole-command runs above already cost their start-up)
    assert cli.main(["gc", str(out), "--keep-generations", "0"]) == 0
    assert f"keep {a.generation}: .refs/trainer-" in capsys.readouterr().out
    shutil.rmtree(ck)  # the trainer's checkpoints are gone: its ref is stale
    assert cli.main(["gc", str(out), "--keep-generations", "0", "--yes"]) == 0
    assert f"removed {a.generation}" in capsys.readouterr().out
    assert not (out / a.generation).exists() and (out / b.generation).is_dir()
    assert sorted(p.name for p in (out / "generations").iterdir()) == [f"{b.generation}.manifest.json"]
    assert list((out / ".refs").iterdir()) == []
    assert load_manifest(str(out)).generation == b.generation
