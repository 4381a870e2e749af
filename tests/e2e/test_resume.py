"""A shard run killed with SIGKILL (driver and every worker process) or stopped by SIGTERM resumes: the rerun
tokenizes and packs only what the stopped run had not finished and writes the same bytes as a run that was
never interrupted."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, stdlib_texts
from tests.ops_fixtures import FAST_LOCAL, dataset_files, kill_group, run_cli, shard_args, subprocess_env

pytestmark = pytest.mark.timeout(240)
# Real worker processes (FnApiRunner's multi_processing mode): the kill must reach them too.
WORKER_PROCESSES = ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]
UNIT_MB = "0.04"  # ~1.6 MB of text in units of 40 KiB: about 40 units


def _corpus(root, limit_bytes=1_600_000, files=3):
    """Standard-library sources as JSON lines, spread over a few files (many documents, a few MB)."""
    root.mkdir()
    docs = [(name, text[i:i + 4000]) for name, text in stdlib_texts(limit_bytes) for i in range(0, len(text), 4000)]
    for i in range(files):
        with open(root / f"part-{i}.jsonl", "w") as f:
            for name, text in docs[i::files]:
                f.write(json.dumps({"text": text, "meta": {"pile_set_name": name.split("_")[0]}}) + "\n")
    return root


def _args(inputs, out, log, beam_args):
    return shard_args(inputs, out, "--unit-mb", UNIT_MB, "--run-log", str(log), *beam_args)


def _events(log, kind):
    return [e for e in map(json.loads, log.read_text().splitlines()) if e.get("event") == kind]


def _group_gone(pgid, timeout_s=10.0) -> bool:
    """Whether every process of the group has exited (killed workers linger as zombies until init reaps them)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _done(out, kind: str = "unit") -> int:
    """Completion markers of `kind` (cut, unit, pack) in the output's staging (pipeline/shard/markers.py)."""
    return sum(1 for _ in (out / "_staging").glob(f"gen-*/done/{kind}-*.json"))


def _done_units(out) -> int:
    return _done(out, "unit")


def test_a_run_killed_at_70_percent_of_its_units_resumes_and_gives_the_uninterrupted_bytes(tmp_path):
    corpus = _corpus(tmp_path / "corpus")
    inputs = [str(corpus / "*")]

    # The uninterrupted run (in-process: the bytes are the same on every runner and worker count).
    twin, twin_log = tmp_path / "twin", tmp_path / "twin.jsonl"
    res = run_cli(_args(inputs, twin, twin_log, FAST_LOCAL), timeout_s=150)
    assert res.returncode == 0, res.stderr[-3000:]
    units = _events(twin_log, "summary")[-1]["counters"]["units_tokenized"]
    assert units >= 30  # enough units that 70% is a real midpoint

    # The run to kill: the CLI in its own session; SIGKILL to its process group (driver and workers) once 70%
    # of the units have their completion marker.
    out, log = tmp_path / "out", tmp_path / "run.jsonl"
    target = math.ceil(0.7 * units)
    proc = _kill_when(_args(inputs, out, log, WORKER_PROCESSES), out, target)
    finished = _done_units(out)
    assert target <= finished < units and not (out / "manifest.json").exists()
    assert _group_gone(proc.pid), "a process of the killed run is still running"

    # The rerun, same command but one in-process worker (units do not depend on the worker count): it reuses
    # every finished unit and tokenizes only the rest (≤ 40%).
    res = run_cli(_args(inputs, out, log, FAST_LOCAL), timeout_s=150)
    assert res.returncode == 0, res.stderr[-3000:]
    event = _events(log, "resume")[-1]  # the log is appended to: the killed run's events come first
    assert event["units_reusable"] == finished and event["notes"] == []
    counters = _events(log, "summary")[-1]["counters"]
    assert counters["units_reused"] == finished
    assert counters["units_tokenized"] == units - finished <= 0.4 * units
    got, want = dataset_files(out), dataset_files(twin)
    assert got.keys() == want.keys()
    assert [k for k in got if got[k] != want[k]] == []  # every shard, dead letter and the manifest: same bytes
    assert not any((out / "_staging").rglob("*.json"))  # staging and its markers are gone after the commit


# Three in-process worker threads for 8 files: fewer than 4 files per worker, so the chunks go through staging
# (pipeline/shard/graph.py spread_chunks_needed); with 1 or 2 workers each file is tokenized as it is cut.
SPREAD_THREADS = ["--runner=FnApiRunner", "--direct_num_workers=3", "--direct_running_mode=multi_threading"]


@pytest.mark.parametrize("rerun_args", [FAST_LOCAL, SPREAD_THREADS], ids=["fused-rerun", "spread-rerun"])
def test_a_run_that_tokenizes_files_as_it_cuts_them_resumes_from_its_units(tmp_path, rerun_args):
    """8 files on 2 worker processes: each file's chunks are tokenized as they are cut (CutAndTokenizeFile),
    and no chunk file is written. Killed at 70% of its units, the run resumes from them, whether the rerun cuts
    and tokenizes files the same way (its finished files are not even read) or spreads the chunks through
    staging (its files are cut again, their units still reused), with the uninterrupted bytes."""
    corpus = _corpus(tmp_path / "corpus", files=8)
    inputs = [str(corpus / "*")]
    twin, twin_log = tmp_path / "twin", tmp_path / "twin.jsonl"
    res = run_cli(_args(inputs, twin, twin_log, FAST_LOCAL), timeout_s=150)
    assert res.returncode == 0, res.stderr[-3000:]
    units = _events(twin_log, "summary")[-1]["counters"]["units_tokenized"]
    assert units >= 30

    out, log = tmp_path / "out", tmp_path / "run.jsonl"
    proc = _kill_when(_args(inputs, out, log, WORKER_PROCESSES), out, math.ceil(0.7 * units))
    assert _group_gone(proc.pid), "a process of the killed run is still running"
    finished = _done_units(out)
    finished_files = _done(out, "cut")
    assert finished < units and not (out / "manifest.json").exists()
    assert finished_files >= 1  # a whole file done: its cut marker, naming no chunk file
    assert not any((out / "_staging").glob("gen-*/chunks/*")), "chunks went through staging"

    res = run_cli(_args(inputs, out, log, rerun_args), timeout_s=150)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _events(log, "resume")[-1]["units_reusable"] == finished
    counters = _events(log, "summary")[-1]["counters"]
    assert counters["units_reused"] == finished
    assert counters["units_tokenized"] == units - finished
    got, want = dataset_files(out), dataset_files(twin)
    assert got.keys() == want.keys()
    assert [k for k in got if got[k] != want[k]] == []


def test_no_resume_starts_afresh_with_a_note(tmp_path):
    corpus = _corpus(tmp_path / "corpus", 400_000, 1)
    inputs = [str(corpus / "*")]
    out, log = tmp_path / "out", tmp_path / "run.jsonl"
    _kill_when(_args(inputs, out, log, FAST_LOCAL), out, 3)
    res = run_cli(_args(inputs, out, log, (*FAST_LOCAL, "--no-resume")), timeout_s=150)
    assert res.returncode == 0, res.stderr[-3000:]
    notes = [line for line in res.stderr.splitlines() if "resume: discarded" in line]
    assert len(notes) == 1 and "--no-resume" in notes[0]
    counters = _events(log, "summary")[-1]["counters"]
    assert counters.get("units_reused", 0) == 0 and counters["units_tokenized"] > 0


def _kill_when(args: list, out, n_done: int, kind: str = "unit", send=None) -> subprocess.Popen:
    """`pileprep ARGS` in its own session, SIGKILLed with its whole process group (driver and worker processes)
    once `n_done` completion markers of `kind` exist; the run must still be going then. `send(proc)` instead of
    the SIGKILL: another way to stop it (the process is then waited for)."""
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, cwd=str(REPO), env=subprocess_env(PYTHONPATH=str(REPO)),
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 150
        while proc.poll() is None and _done(out, kind) < n_done and time.monotonic() < deadline:
            time.sleep(0.005)
        assert proc.poll() is None, "the run finished before the kill point"
        (send or (lambda p: os.killpg(p.pid, signal.SIGKILL)))(proc)
        proc.stderr_text = proc.communicate(timeout=60)[1].decode(errors="replace")
    finally:
        kill_group(proc)
    return proc


# ------------------------------------------------------------------------------------------ packed shards
PACK_SHARDS = ("--num-shards", "120")  # many small shards: packing takes long enough to stop it midway


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    """The uninterrupted run of a corpus packed into many shards: (inputs, its output, train+val+test shards)."""
    root = tmp_path_factory.mktemp("packs")
    corpus = _corpus(root / "corpus", 800_000, 2)
    inputs = [str(corpus / "*")]
    twin, log = root / "twin", root / "twin.jsonl"
    res = run_cli([*_args(inputs, twin, log, FAST_LOCAL), *PACK_SHARDS], timeout_s=150)
    assert res.returncode == 0, res.stderr[-3000:]
    shards = len(json.loads((twin / "manifest.json").read_text())["shards"])
    assert shards >= 120
    return inputs, twin, shards


@pytest.mark.parametrize("stop", ["sigkill", "sigterm"])
def test_a_run_stopped_while_packing_reuses_its_packed_shards_and_gives_the_uninterrupted_bytes(
        many_shards, tmp_path, stop):
    # SIGKILL of every process (worker processes), or SIGTERM to the driver (in-process workers): the driver
    # then keeps the finished work itself (pipeline/shard/resume.py keep_finished) and says so in its line.
    inputs, twin, shards = many_shards
    out, log = tmp_path / "out", tmp_path / "run.jsonl"
    args = [*_args(inputs, out, log, WORKER_PROCESSES if stop == "sigkill" else FAST_LOCAL), *PACK_SHARDS]
    proc = _kill_when(args, out, shards // 2, "pack",
                      None if stop == "sigkill" else lambda p: os.kill(p.pid, signal.SIGTERM))
    packed, units = _done(out, "pack"), _done(out, "unit")
    assert shards // 2 <= packed < shards and not (out / "manifest.json").exists()
    assert _group_gone(proc.pid), "a process of the stopped run is still running"
    if stop == "sigterm":
        line = proc.stderr_text.strip().splitlines()[-1]
        assert proc.returncode == 143 and line.endswith(
            f"; {units} finished units and {packed} packed shards kept for the next run (--no-resume discards "
            "them)"), line
    generation = next((out / "_staging").glob("gen-*/resume.json")).parent.name.split(".")[0]
    left = len(list((out / generation).glob("*.tfrecord")))
    # SIGKILL may land between a shard and its marker (one per worker); after SIGTERM only marked shards are left
    assert packed <= left <= packed + 2 if stop == "sigkill" else left == packed

    res = run_cli([*_args(inputs, out, log, FAST_LOCAL), *PACK_SHARDS], timeout_s=150)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _events(log, "resume")[-1]["shards_reusable"] == packed
    counters = _events(log, "summary")[-1]["counters"]
    assert counters["shards_reused"] == packed and counters["shards_packed"] == shards - packed
    assert counters["units_reused"] == units and counters.get("units_tokenized", 0) == 0
    got, want = dataset_files(out), dataset_files(twin)
    assert got.keys() == want.keys()
    assert [k for k in got if got[k] != want[k]] == []  # every shard, the id index and the manifest: same bytes
