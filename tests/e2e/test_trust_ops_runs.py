"""Trust in operations, end to end through the `pileprep` CLI: one writer per output, committed files
never rewritten, operator mistakes and interruptions end in one line with the previous dataset intact.

Small real inputs (../shared/data) and the in-process runner keep each case to a few seconds.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from model_contract import load_manifest
from pipeline.ops import lock
from tests.conftest import REPO
from tests.ops_fixtures import FAST_LOCAL, dataset_files, kill_group, real_corpus, run_cli, shard_args, subprocess_env

pytestmark = pytest.mark.timeout(240)
SMALL = ("pile/00.jsonl.zst", "other/enron_examples.jsonl")


def _shard(inputs, out, *extra, timeout_s=150, env=None):
    return run_cli(shard_args(inputs, out, *extra, *FAST_LOCAL), timeout_s=timeout_s, env=env)


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines()
             if ln.startswith("pileprep:") and not ln.startswith("pileprep: WARNING")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return lines[0]


def _generation_dirs(out):
    return sorted(p.name for p in out.glob("gen-*"))


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """A committed dataset over two small real files; tests copy it before changing anything."""
    tmp = tmp_path_factory.mktemp("committed")
    corpus = real_corpus(tmp / "corpus", names=SMALL)
    # Glob matches that are not files: listed in the warnings and the manifest, not skipped silently.
    (corpus / "subdir.jsonl").mkdir()
    (corpus / "dangling.jsonl").symlink_to(tmp / "nowhere.jsonl")
    out = tmp / "out"
    res = _shard([str(corpus / "*")], out)
    assert res.returncode == 0, res.stderr[-3000:]
    return {"corpus": corpus, "out": out, "files": dataset_files(out), "stderr": res.stderr}


def _copy(committed, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(committed["out"], out)
    return out


# --------------------------------- one writer per output, a damaged dataset (docs/OPERATIONS.md, "The commit protocol")
def test_a_second_run_on_a_locked_output_exits_2_and_touches_nothing(committed, tmp_path):
    out = _copy(committed, tmp_path)
    holder = lock.OutputLock(str(out))
    with holder.held():
        res = _shard([str(committed["corpus"] / "*")], out, "--seed", "7")
        line = _one_line(res.stderr)
        assert res.returncode == 2 and "output is locked by" in line and f"pid {os.getpid()} since" in line
    assert dataset_files(out) == committed["files"]
    # --break-lock: the operator knows the holder is gone.
    _foreign = out / lock.LOCK_NAME
    _foreign.write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": time.time(), "token": "t"}))
    res = _shard([str(committed["corpus"] / "*")], out, "--break-lock")
    assert res.returncode == 0 and "nothing to do" in res.stdout, res.stderr[-2000:]
    assert not _foreign.exists()


def test_nothing_to_do_only_when_every_manifest_file_has_its_size(committed, tmp_path):
    out = _copy(committed, tmp_path)
    manifest = load_manifest(str(out))
    victim = out / manifest.shards[0].path
    victim.write_bytes(b"")  # a committed shard truncated (as the second of two racing runs did)
    res = _shard([str(committed["corpus"] / "*")], out)
    assert res.returncode == 0 and "nothing to do" not in res.stdout, res.stdout + res.stderr[-2000:]
    rebuilt = load_manifest(str(out))
    assert rebuilt.generation != manifest.generation  # a new directory: the live one was never written into
    # the damaged generation stays beside it as the previous one (--keep-generations 1), with its own manifest
    assert _generation_dirs(out) == sorted([rebuilt.generation, manifest.generation])
    assert sorted(p.name for p in (out / "generations").iterdir()) == sorted(
        f"{g}.manifest.json" for g in (rebuilt.generation, manifest.generation))
    for s in rebuilt.shards:
        assert (out / s.path).stat().st_size == s.bytes
    assert [(s.split, s.bytes, s.sha256) for s in rebuilt.shards] == [
        (s.split, s.bytes, s.sha256) for s in manifest.shards]  # same data, same bytes
    assert "Traceback" not in res.stderr


def test_an_incremental_run_over_a_damaged_dataset_says_so(committed, tmp_path):
    out = _copy(committed, tmp_path)
    manifest = load_manifest(str(out))
    (out / manifest.shards[-1].path).unlink()
    res = _shard([str(committed["corpus"] / "*")], out, "--incremental")
    line = _one_line(res.stderr)
    assert res.returncode == 1 and "damaged" in line and "missing" in line and "without --incremental" in line


# ------------------------------------------------------------------------ docs/OPERATIONS.md, "Failures and interrupts"
def _finished_units_left(out) -> int:
    """What a failed or interrupted run may leave in staging (docs/OPERATIONS.md "Failures and interrupts"): at
    most its one staging directory, holding only the resume record, the staging marker, completion markers and
    the staging files they name (no in-progress unit, temp file or progress dir). Returns its unit markers."""
    stagings = sorted((out / "_staging").glob("gen-*"))
    if not stagings:
        return 0
    assert len(stagings) == 1 and not stagings[0].name.endswith(".progress"), stagings
    staging = stagings[0]
    named = {".pileprep-staging.json", "resume.json"}
    for marker in (staging / "done").glob("*.json"):
        named.add(f"done/{marker.name}")
        named.update(r["path"] for r in json.loads(marker.read_text())["files"] if r["root"] == "staging")
        if marker.name.startswith(("unit-f", "cut-f")):  # and its input's sha256 (pipeline/shard/input_digests.py)
            named.add(f"inputs/f{marker.name.split('-f', 1)[1][:6]}.json")
    assert {str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file()} == named
    units = len(list((staging / "done").glob("unit-*.json")))
    assert units > 0  # a staging without a finished unit is not kept
    return units


def _kept_line(units: int) -> str:
    if not units:
        return ""
    return f"; {units} finished unit{'s' * (units != 1)} kept for the next run (--no-resume discards them)"


def _run_log_events(log, kind):
    return [e for e in map(json.loads, log.read_text().splitlines()) if e.get("event") == kind]


def test_a_failed_run_keeps_its_finished_units_and_the_rerun_writes_the_uninterrupted_bytes(committed, tmp_path):
    inputs, args = _more_inputs(committed, tmp_path), MORE_ARGS
    twin = tmp_path / "twin"
    shutil.copytree(committed["out"], twin)
    res = _shard(inputs, twin, *args)  # the same run, never failing
    assert res.returncode == 0, res.stderr[-3000:]

    out, log = _copy(committed, tmp_path), tmp_path / "run.jsonl"
    env = subprocess_env(PYTHONPATH=str(REPO), PILEPREP_FAULT_ENOSPC_AFTER_BYTES=str(1_300_000))
    res = _shard(inputs, out, *args, "--run-log", str(log), env=env)
    line = _one_line(res.stderr)
    units = _finished_units_left(out)
    assert res.returncode == 1 and "no space left on device" in line and "previous dataset is intact" in line
    assert units > 0 and line.endswith(_kept_line(units)), line
    assert dataset_files(out) == committed["files"]  # no partial generation, nothing else changed

    res = _shard(inputs, out, *args, "--run-log", str(log))  # the same command, with space again
    assert res.returncode == 0, res.stderr[-3000:]
    assert _run_log_events(log, "resume")[-1]["units_reusable"] == units
    counters = _run_log_events(log, "summary")[-1]["counters"]
    assert counters["units_reused"] == units and counters["units_tokenized"] > 0  # a real midpoint
    got, want = dataset_files(out), dataset_files(twin)
    assert got.keys() == want.keys() and [k for k in got if got[k] != want[k]] == []
    assert not any((out / "_staging").glob("gen-*"))


def test_enospc_mid_run_with_no_resume_is_one_line_and_leaves_nothing(committed, tmp_path):
    out = _copy(committed, tmp_path)
    extra = real_corpus(tmp_path / "more", names=("other/arxiv.jsonl",))
    env = subprocess_env(PYTHONPATH=str(REPO), PILEPREP_FAULT_ENOSPC_AFTER_BYTES=str(1_300_000))
    res = _shard([str(committed["corpus"] / "*"), str(extra / "*")], out, "--incremental", "--unit-mb", "0.05",
                 "--no-resume", env=env)
    line = _one_line(res.stderr)
    assert res.returncode == 1 and "no space left on device" in line and "previous dataset is intact" in line
    assert "kept for the next run" not in line
    assert dataset_files(out) == committed["files"]  # partial generation removed, nothing else changed
    assert not any((out / "_staging").glob("gen-*"))


def _start(args, beam_args=tuple(FAST_LOCAL)):
    return subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args, *beam_args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=subprocess_env(PYTHONPATH=str(REPO)), cwd=str(REPO),
                            start_new_session=True)


def _wait_for(proc, predicate, timeout_s=120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if predicate():
            return True
        time.sleep(0.01)
    return False


def _signal_mid_run(committed, tmp_path, send, beam_args=tuple(FAST_LOCAL), extra=()):
    """Start an incremental run that adds a bigger file to a copy of the committed dataset; `send(proc)` once
    its first tokenized unit is finished (its completion marker in staging). Returns (output dir, return code,
    stderr)."""
    out = _copy(committed, tmp_path)
    proc = _start(shard_args(_more_inputs(committed, tmp_path), out, *MORE_ARGS, *extra), beam_args)
    try:
        assert _wait_for(proc, lambda: any((out / "_staging").glob("gen-*/done/unit-*.json"))), \
            "finished before the signal"
        send(proc)
        _out, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    return out, proc.returncode, err.decode(errors="replace")


MORE_ARGS = ("--incremental", "--unit-mb", "0.05")  # about 14 units in the added file


def _more_inputs(committed, tmp_path) -> list:
    extra = tmp_path / "more"
    if not extra.exists():
        real_corpus(extra, names=("other/arxiv.jsonl",))
    return [str(committed["corpus"] / "*"), str(extra / "*")]


def test_sigterm_ends_in_one_line_with_the_previous_dataset_intact(committed, tmp_path):
    # The driver only, as a scheduler's TERM reaches it (SIGINT takes the same path, exit 130: unit test).
    log = tmp_path / "run.jsonl"
    out, code, err = _signal_mid_run(committed, tmp_path, lambda proc: os.kill(proc.pid, signal.SIGTERM),
                                     extra=("--run-log", str(log)))
    units = _finished_units_left(out)
    assert code == 143 and _one_line(err) == "pileprep: interrupted; previous dataset intact" + _kept_line(units)
    assert units > 0 and dataset_files(out) == committed["files"]  # no partial generation
    # the same command again: the kept units are reused (the bytes: the ENOSPC case above, against a twin)
    res = _shard(_more_inputs(committed, tmp_path), out, *MORE_ARGS, "--run-log", str(log))
    assert res.returncode == 0, res.stderr[-3000:]
    assert _run_log_events(log, "summary")[-1]["counters"]["units_reused"] == units


def test_sigterm_stops_the_default_in_process_workers_before_cleaning_up(committed, tmp_path):
    # No runner flags: the CLI's default local runner, worker threads in the driver's process on small machines
    # (shard_pipeline.default_beam_args). Those threads must stop before the staging is removed, and none may be
    # inside native tokenizer code at exit (that aborted with exit 134, seen before pipeline/shard/cancel.py).
    out, code, err = _signal_mid_run(committed, tmp_path, lambda proc: os.kill(proc.pid, signal.SIGTERM), ())
    line = _one_line(err)
    assert code == 143 and line == "pileprep: interrupted; previous dataset intact" + _kept_line(
        _finished_units_left(out)), err
    assert dataset_files(out) == committed["files"]  # no partial generation; staging: finished units only


def test_a_killed_runs_staging_and_partial_generation_are_removed_by_the_next_run(committed, tmp_path):
    out, _code, _err = _signal_mid_run(committed, tmp_path, lambda proc: os.killpg(proc.pid, signal.SIGKILL))
    staged = [p.parent for p in (out / "_staging").glob("gen-*/.pileprep-staging.json")]
    assert len(staged) == 1  # the marker says whose staging this is
    assert (out / lock.LOCK_NAME).exists()  # left behind; its holder is dead on this host, so it is stale
    res = _shard([str(committed["corpus"] / "*")], out)  # any run on this output
    assert res.returncode == 0, res.stderr[-2000:]
    assert not staged[0].exists() and _generation_dirs(out) == [load_manifest(str(out)).generation]
    assert dataset_files(out) == committed["files"]


def test_a_text_field_no_record_has_exits_2_before_any_work(committed, tmp_path):
    out = tmp_path / "out"
    res = _shard([str(committed["corpus"] / "*")], out, "--text-field", "body")
    line = _one_line(res.stderr)
    assert res.returncode == 2 and "--text-field body" in line and "keys seen: " in line and "text" in line
    assert not (out / "manifest.json").exists() and not list(out.glob("gen-*"))


def test_too_many_dead_letters_fail_the_run_without_committing(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    good = [json.dumps({"text": f"document number {i} with a few words"}) for i in range(300)]
    bad = ["{not json" for _ in range(900)]
    (corpus / "mixed.jsonl").write_text("\n".join(good[:100] + bad + good[100:]) + "\n")
    out = tmp_path / "out"
    res = _shard([str(corpus / "*")], out)
    line = _one_line(res.stderr)
    assert res.returncode == 1 and "900 of 1200 records" in line and "invalid_json 900" in line
    assert "--max-dead-letter-fraction 0.5" in line and not (out / "manifest.json").exists()
    # What is left of the partial generation is only what the kept units and packed shards wrote (their
    # dead letters, the shards), and the line says so (docs/OPERATIONS.md "Resume"). The threshold's edges,
    # small files committing: unit/ops/test_guards.py.
    left = [p for p in out.glob("gen-*/**/*") if p.is_file()]
    assert bool(left) == ("packed shard" in line)
    assert {p.suffix for p in left} <= {".tfrecord", ".jsonl"} and not (out / "manifest.json").exists()


def test_glob_matches_that_are_not_files_are_warned_about_and_recorded(committed):
    corpus = committed["corpus"]
    assert "subdir.jsonl: directory; skipped" in committed["stderr"]
    assert "dangling.jsonl: dangling symlink; skipped" in committed["stderr"]
    manifest = load_manifest(str(committed["out"]))
    assert manifest.skipped_inputs == [{"path": str(corpus / "dangling.jsonl"), "reason": "dangling_symlink"},
                                       {"path": str(corpus / "subdir.jsonl"), "reason": "directory"}]


def test_an_unwritable_local_output_exits_2(committed, tmp_path):
    (tmp_path / "a-file").write_text("x")
    res = _shard([str(committed["corpus"] / "*")], tmp_path / "a-file" / "out")
    line = _one_line(res.stderr)
    assert res.returncode == 2 and "--output" in line and "not writable" in line
