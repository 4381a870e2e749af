"""Issue 7 (trust: operations): fast unit tests for the failure-handling paths — reconciliation, TFRecord
damage, commit ordering, merged totals, manifest validation and path containment, locking.

Each test here was checked against a deliberate breakage of the code it guards (see the closing note).
"""
from __future__ import annotations

import errno
import io
import json
import logging
import os
import re
import socket
import time

import numpy as np
import pytest

from model_contract import (ContractError, DataContract, Manifest, ShardInfo, TFRecordCorruptError, TokenizerInfo,
                            encode_example, frame_record, iter_records)
from pipeline.config import ShardConfig
from pipeline.errors import ConfigError, RunError
from pipeline.ops import commit, guards, lock, redaction
from pipeline.shard import integrity, manifest_builder
from transforms.io import io_utils
from transforms.shard import stages

TOK = TokenizerInfo("sentencepiece", "ab" * 32, 1000, 2, 3, 0, 1)
GEN_A, GEN_B, GEN_C = ("gen-" + c * 16 for c in "abc")


def _config(**kw) -> ShardConfig:
    return ShardConfig(**{"inputs": ("in/*",), "output": "/out", "tokenizer": "t.model", "seq_len": 8, **kw})


def _split_result(path, read, dead=0):
    stats = stages.FileStats(read=read)
    if dead:
        stats.dead_letter("invalid_json", dead)
    return stages.SplitResult(0, path, [], stats, None)


def _shard_result(path, written, split=0):
    task = stages.ShardTask(split, 0, 1)
    return stages.ShardResult(task, f"/out/{GEN_A}/{task.file_name}", examples=1, tokens=5, padding_tokens=3,
                              documents=written, bytes=10, sha256="0" * 64,
                              sources={"s": {"documents": written, "tokens": 5}}, written_per_file={path: written})


# --------------------------------------------------------------------------------- §8: reconciliation
def test_counts_that_do_not_reconcile_are_refused():
    contract = DataContract.for_tokens(8, TOK)
    ok = manifest_builder.build_manifest(_config(), contract, [("a.jsonl", 10)], GEN_A, "/out",
                                         [_split_result("a.jsonl", 3, dead=1)], [], [_shard_result("a.jsonl", 2)])
    assert ok.records["read"] == 3 and ok.records["written"] == 2
    with pytest.raises(manifest_builder.ReconciliationError, match=r"a.jsonl: read 4 but .* = 3"):
        manifest_builder.build_manifest(_config(), contract, [("a.jsonl", 10)], GEN_A, "/out",
                                        [_split_result("a.jsonl", 4, dead=1)], [], [_shard_result("a.jsonl", 2)])


# ------------------------------------------------------------------------------- §8: TFRecord damage
def _records(n=4):
    payloads = [encode_example({"x": np.arange(i + 3)}) for i in range(n)]
    frames = [frame_record(p) for p in payloads]
    offsets = list(np.cumsum([0] + [len(f) for f in frames])[:-1])
    return payloads, b"".join(frames), offsets


def test_a_flipped_payload_byte_is_reported_with_its_offset():
    payloads, blob, offsets = _records()
    damaged = bytearray(blob)
    damaged[offsets[2] + 12 + 1] ^= 0x01  # one bit inside record 2's payload: still parses as bytes
    with pytest.raises(TFRecordCorruptError, match=rf"record 2 at byte offset {offsets[2]} data checksum"):
        list(iter_records(io.BytesIO(bytes(damaged)), name="s.tfrecord"))
    assert list(iter_records(io.BytesIO(blob))) == payloads


def test_a_flipped_length_byte_is_a_checksum_error_with_its_offset():
    _payloads, blob, offsets = _records()
    damaged = bytearray(blob)
    damaged[offsets[1]] ^= 0x01  # record 1's length, off by one: would read a wrong frame, not run short
    with pytest.raises(TFRecordCorruptError, match=rf"record 1 at byte offset {offsets[1]} length checksum"):
        list(iter_records(io.BytesIO(bytes(damaged)), name="s.tfrecord"))


# ------------------------------------------------------------------------------ §8: commit ordering
def _manifest(generation, shards=(), records=None, dead_letters=(), inputs=()):
    contract = DataContract.for_tokens(8, TOK)
    m = Manifest(contract=contract, shards=list(shards), records=records or {}, dead_letters=list(dead_letters),
                 inputs=list(inputs))
    m.generation = generation
    m.generations = [{"name": generation, "inputs": len(inputs), "shards": len(shards), "examples": 0,
                      "tokens": 0, "documents": 0}]
    m.ledger = []
    return m


def _shard(gen, name="train-00000-of-00001.tfrecord", size=1):
    return ShardInfo(f"{gen}/{name}", "train", 1, 1, 0, 1, size, "0" * 64)


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
    commit.commit_dataset(str(out), _manifest(GEN_A, [_shard(GEN_A)]), None, str(out / "_staging" / GEN_A))
    assert [e[0] for e in events] == ["fsync", "publish"]
    assert events[0][1] == [str(out / GEN_A / "train-00000-of-00001.tfrecord")]


# --------------------------------------------------------------------------- §8: merged totals
def test_totals_after_two_generations_equal_the_sum_of_both():
    rec_a = {"read": 10, "written": 7, "filtered": {"empty": 2}, "dead_lettered": {"invalid_json": 1}}
    rec_b = {"read": 5, "written": 4, "filtered": {"empty": 1}, "dead_lettered": {}}
    a = _manifest(GEN_A, [_shard(GEN_A)], rec_a, inputs=[{"path": "a", "read": 10}])
    a.splits = {"train": {"documents": 7, "tokens": 70, "examples": 3, "shards": 1, "padding_tokens": 2}}
    a.sources = {"s": {"train": {"documents": 7, "tokens": 70}}}
    b = _manifest(GEN_B, [_shard(GEN_B)], rec_b, inputs=[{"path": "b", "read": 5}])
    b.splits = {"train": {"documents": 4, "tokens": 40, "examples": 2, "shards": 1, "padding_tokens": 1}}
    b.sources = {"s": {"train": {"documents": 4, "tokens": 40}}}
    merged = integrity.merge(a, b)
    assert merged.records == {"read": 15, "written": 11, "filtered": {"empty": 3},
                              "dead_lettered": {"invalid_json": 1}}
    assert merged.splits["train"] == {"documents": 11, "tokens": 110, "examples": 5, "shards": 2,
                                      "padding_tokens": 3}
    assert merged.sources == {"s": {"train": {"documents": 11, "tokens": 110}}}
    assert [g["name"] for g in merged.generations] == [GEN_A, GEN_B] and merged.generation == GEN_B
    assert [s.path for s in merged.shards] == [s.path for s in a.shards + b.shards]


# ------------------------------------------------------------------ §3: nothing outside the output deleted
def _valid_dict():
    m = _manifest(GEN_A, [_shard(GEN_A)], dead_letters=[f"{GEN_A}/dead_letter/f000000-read.jsonl"])
    m.ledger = [{"path": "in/a.jsonl", "bytes": 3, "generation": GEN_A}]
    return json.loads(m.to_json())


@pytest.mark.parametrize("entry,damage", [
    ("generations[0].name", lambda d: d["generations"][0].update(name="/tmp/victim")),
    ("generations[0].name", lambda d: d["generations"][0].update(name="../..")),
    ("generation", lambda d: d.update(generation="gen-0123456789abcdef/../../x")),
    ("shards[0].path", lambda d: d["shards"][0].update(path="/etc/passwd")),
    ("shards[0].path", lambda d: d["shards"][0].update(path=f"{GEN_A}/../../x.tfrecord")),
    ("dead_letters[0]", lambda d: d.update(dead_letters=["../outside.jsonl"])),
    ("ledger[0].generation", lambda d: d["ledger"][0].update(generation="..")),
    ("ledger[0].bytes", lambda d: d["ledger"][0].update(bytes="many")),
    ("generations[0].tokens", lambda d: d["generations"][0].update(tokens=-1)),
])
def test_a_damaged_manifest_is_refused_naming_the_entry(entry, damage):
    d = _valid_dict()
    assert Manifest.from_json(json.dumps(d)).generation == GEN_A
    damage(d)
    with pytest.raises(ContractError, match=re.escape(entry)):
        Manifest.from_json(json.dumps(d))


def test_the_one_resolver_keeps_shard_paths_inside_the_dataset():
    from model_contract import resolve_shard_path

    assert resolve_shard_path("/d/manifest.json", _shard(GEN_A)) == f"/d/{GEN_A}/train-00000-of-00001.tfrecord"
    assert resolve_shard_path("s3://b/p/manifest.json", "x/y.tfrecord") == "s3://b/p/x/y.tfrecord"
    for bad in ("/etc/passwd", "../x", "a/../../x", "a//b", "s3://other/x", "a\\..\\x", ""):
        with pytest.raises(ContractError, match="shard path"):
            resolve_shard_path("/d/manifest.json", bad)


def test_a_manifest_naming_outside_directories_deletes_nothing(tmp_path):
    out, victim, victim2 = tmp_path / "out", tmp_path / "victim", tmp_path / "victim2"
    for d in (out / GEN_A, out / GEN_B, victim, victim2):
        d.mkdir(parents=True)
        (d / "keep.txt").write_text("mine")
        (d / "train-00000-of-00001.tfrecord").write_bytes(b"x")
    previous = _manifest(GEN_A, [_shard(GEN_A)])
    previous.generations += [{"name": str(victim)}, {"name": "../victim2"}]  # as if loaded without validation
    (out / "manifest.json").write_text(previous.to_json())
    with pytest.raises(ContractError, match=r"generations\[1\]\.name"):
        commit.read_committed(str(out))
    (out / "manifest.json").write_text(_manifest(GEN_A, [_shard(GEN_A)]).to_json())
    commit.commit_dataset(str(out), _manifest(GEN_B, [_shard(GEN_B)]), GEN_A, str(out / "_staging" / GEN_B),
                          previous=previous)
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
        commit.commit_dataset(str(out), _manifest(GEN_A, [_shard(GEN_A)]), None, str(out / GEN_A))
    assert (out / GEN_A / "train-00000-of-00001.tfrecord").exists() and not (out / "manifest.json").exists()


def test_the_manifest_temp_file_has_a_unique_name(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "manifest.json.tmp").write_text("a user's file")
    commit.publish_manifest(str(out), _manifest(GEN_A, [_shard(GEN_A)]).to_json())
    assert (out / "manifest.json.tmp").read_text() == "a user's file"
    assert Manifest.from_json((out / "manifest.json").read_text()).generation == GEN_A
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "manifest.json.tmp"]


# ------------------------------------------------------------------------------------- §4: the lock
def test_a_second_lock_on_the_same_output_is_refused_naming_the_holder(tmp_path):
    first = lock.OutputLock(str(tmp_path / "out"))
    with first.held():
        with pytest.raises(lock.OutputLockedError, match=rf"output is locked by {socket.gethostname()} pid "
                                                         rf"{os.getpid()} since \d{{4}}-\d\d-\d\d"):
            lock.OutputLock(str(tmp_path / "out")).acquire()
        assert json.loads((tmp_path / "out" / lock.LOCK_NAME).read_text())["token"] == first.token
    assert not (tmp_path / "out" / lock.LOCK_NAME).exists()  # released
    with lock.OutputLock(str(tmp_path / "out")).held():  # and free again
        pass


def _foreign_lock(out, age_s):
    out.mkdir(parents=True, exist_ok=True)
    path = out / lock.LOCK_NAME
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": time.time() - age_s, "token": "t"}))
    os.utime(path, (time.time() - age_s, time.time() - age_s))
    return path


def test_a_lock_whose_lease_ran_out_is_taken_over_and_break_lock_takes_a_live_one(tmp_path):
    out = tmp_path / "out"
    _foreign_lock(out, age_s=lock.LEASE_S + 5)
    with lock.OutputLock(str(out)).held() as mine:  # stale: taken over
        assert json.loads((out / lock.LOCK_NAME).read_text())["token"] == mine.token
    _foreign_lock(out, age_s=1)
    with pytest.raises(lock.OutputLockedError, match="locked by elsewhere pid 1"):
        lock.OutputLock(str(out)).acquire()
    with lock.OutputLock(str(out)).held(break_lock=True) as mine:
        assert json.loads((out / lock.LOCK_NAME).read_text())["token"] == mine.token
        # A second run that had also judged the old lock ("t") stale removes only that one, never ours.
        lock.OutputLock(str(out))._remove("t")
        assert json.loads((out / lock.LOCK_NAME).read_text())["token"] == mine.token


def test_the_heartbeat_renews_the_lease_and_notices_a_broken_lock(tmp_path):
    out = tmp_path / "out"
    held = lock.OutputLock(str(out), renew_s=0.05)
    held.acquire()
    try:
        path = out / lock.LOCK_NAME
        os.utime(path, (time.time() - 100, time.time() - 100))
        deadline = time.time() + 5
        while time.time() - path.stat().st_mtime > 50 and time.time() < deadline:
            time.sleep(0.02)
        assert time.time() - path.stat().st_mtime < 50  # renewed
        with lock.OutputLock(str(out)).held(break_lock=True):
            deadline = time.time() + 5
            while not held.lost and time.time() < deadline:
                time.sleep(0.02)
            assert held.lost
    finally:
        held.release()


def test_a_lock_of_a_dead_process_on_this_host_is_stale_at_once(tmp_path):
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "out"
    out.mkdir()
    (out / lock.LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid,
                                                  "started": time.time(), "token": "t"}))
    with lock.OutputLock(str(out)).held():
        pass


# ----------------------------------------------------------------------- §4: files are written once
def test_a_failed_writer_publishes_nothing_and_a_rewrite_never_truncates_the_old_file(tmp_path):
    path = tmp_path / "g" / "train-00000-of-00001.tfrecord"
    with pytest.raises(ValueError):
        with io_utils.open_write(str(path)) as f:
            f.write(b"partial")
            raise ValueError("killed mid-write")
    assert not path.exists() and list(path.parent.iterdir()) == []
    io_utils.write_bytes(str(path), b"committed bytes")
    reader = open(path, "rb")
    with io_utils.open_write(str(path)) as f:
        f.write(b"new")
        assert path.read_bytes() == b"committed bytes"  # not opened for writing: still whole
    assert path.read_bytes() == b"new" and reader.read() == b"committed bytes"
    reader.close()
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_the_enospc_fault_point_fails_local_writes(tmp_path, monkeypatch):
    monkeypatch.setenv(io_utils.FAULT_ENOSPC_ENV, "10")
    monkeypatch.setattr(io_utils, "_fault_written", [0])
    with pytest.raises(OSError) as info:
        io_utils.write_bytes(str(tmp_path / "x"), b"y" * 100)
    assert info.value.errno == errno.ENOSPC and not (tmp_path / "x").exists()


# -------------------------------------------------------------------------------------- §6: guards
def test_redaction_removes_userinfo_from_messages_and_log_records():
    from pipeline.ops.redaction import RedactingFilter, redact_userinfo

    text = "cannot reach http://AKIA:s3cr3t@minio:9000/b and s3://u:p@h/x; fine: http://host/a@b"
    assert redact_userinfo(text) == "cannot reach http://***@minio:9000/b and s3://***@h/x; fine: http://host/a@b"
    record = logging.LogRecord("x", logging.WARNING, "f", 1, "endpoint %s failed", ("http://a:s3cr3t@h",), None)
    RedactingFilter().filter(record)
    assert "s3cr3t" not in record.getMessage() and "***@h" in record.getMessage()
    assert "s3cr3t" not in redaction.redact("url http://a:s3cr3t@h")


def test_glob_matches_that_are_not_files_are_listed(tmp_path):
    (tmp_path / "a.jsonl").write_text("{}\n")
    (tmp_path / "d.jsonl").mkdir()
    (tmp_path / "gone.jsonl").symlink_to(tmp_path / "missing")
    assert guards.skipped_inputs([str(tmp_path / "*.jsonl")]) == [
        {"path": str(tmp_path / "d.jsonl"), "reason": "directory"},
        {"path": str(tmp_path / "gone.jsonl"), "reason": "dangling_symlink"}]


def test_a_text_field_that_no_sampled_record_has_is_a_config_error_naming_the_keys(tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_text("".join(json.dumps({"content": f"doc {i}", "meta": {"src": "x"}}) + "\n" for i in range(5))
                 + "not json\n")
    with pytest.raises(ConfigError, match=r"--text-field text: none of the first 5 records has it \(keys seen: "
                                          r"content, meta, meta.src\)"):
        guards.sample_text_field([str(f)], "text", 1 << 20)
    assert guards.sample_text_field([str(f)], "content", 1 << 20) == {"sampled": 5, "with_field": 5}
    assert guards.sample_text_field([str(f)], "meta.src", 1 << 20)["with_field"] == 5


def test_the_dead_letter_fraction_applies_from_a_thousand_records():
    guards.check_dead_letter_rate({"read": 999, "dead_lettered": {"invalid_json": 999}}, 0.5)
    guards.check_dead_letter_rate({"read": 1000, "dead_lettered": {"invalid_json": 500}}, 0.5)
    with pytest.raises(RunError, match=r"501 of 1000 records \(50.1%\).*\(invalid_json 400, text_missing 101\)"):
        guards.check_dead_letter_rate({"read": 1000, "dead_lettered": {"invalid_json": 400, "text_missing": 101}},
                                      0.5)


def test_damaged_files_names_missing_and_resized_shards(tmp_path):
    out = tmp_path / "out"
    (out / GEN_A).mkdir(parents=True)
    (out / GEN_A / "train-00000-of-00001.tfrecord").write_bytes(b"x")
    (out / GEN_A / "train-00001-of-00001.tfrecord").write_bytes(b"")
    m = _manifest(GEN_A, [_shard(GEN_A), _shard(GEN_A, "train-00001-of-00001.tfrecord"),
                          _shard(GEN_A, "val-00000-of-00001.tfrecord")])
    problems = guards.damaged_files(str(out), m)
    assert len(problems) == 2
    assert "train-00001-of-00001.tfrecord: 0 bytes, the manifest says 1" in problems[0]
    assert "val-00000-of-00001.tfrecord: missing" in problems[1]


def test_leftovers_of_a_crashed_run_on_this_output_are_removed_and_nothing_else(tmp_path):
    out, staging = tmp_path / "out", tmp_path / "staging"
    for d in (out / GEN_A, out / GEN_B, out / "user-dir", staging / GEN_B, staging / GEN_C):
        d.mkdir(parents=True)
        (d / "f").write_text("x")
    guards.mark_staging(str(staging / GEN_B), str(out), GEN_B)
    guards.mark_staging(str(staging / GEN_C), str(tmp_path / "other-output"), GEN_C)
    removed = guards.cleanup_abandoned(str(out), str(staging), _manifest(GEN_A, [_shard(GEN_A)]))
    assert sorted(removed) == sorted([str(staging / GEN_B), str(out / GEN_B)])
    assert (out / GEN_A / "f").exists() and (out / "user-dir" / "f").exists() and (staging / GEN_C / "f").exists()


def test_local_output_that_cannot_be_written_is_a_config_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"--output .*file/out: not writable"):
        guards.check_local_writable(str(tmp_path / "file" / "out"), "--output")
    guards.check_local_writable(str(tmp_path / "new" / "out"), "--output")
    assert not (tmp_path / "new").exists()  # checked, not created (a run failing later leaves nothing)
    (tmp_path / "fine").mkdir()
    guards.check_local_writable(str(tmp_path / "fine"), "--output")
    assert list((tmp_path / "fine").iterdir()) == []  # the probe is gone


def test_interrupts_exit_130_and_143_in_one_line_even_through_beams_rewrapping(monkeypatch, capsys):
    import signal

    from pipeline import cli
    from pipeline.errors import RunInterrupted

    assert RunInterrupted(signal.SIGINT).exit_code == 130 and RunInterrupted(signal.SIGTERM).exit_code == 143
    assert RunInterrupted("interrupted by signal 15 [while running 'Tokenize']").exit_code == 143
    for raised, code in ((RunInterrupted(2), 130), (RunInterrupted(15), 143)):
        def interrupted(*_a, exc=raised):
            raise exc
        monkeypatch.setattr(cli, "cmd_shard", interrupted)
        assert cli.main(["shard", "--input", "x", "--output", "y", "--tokenizer", "z"]) == code
        assert capsys.readouterr().err == "pileprep: interrupted; previous dataset intact\n"


def test_inspect_refuses_a_shard_path_outside_the_dataset(tmp_path, capsys):
    from pipeline.cli import main as cli_main

    (tmp_path / "secret.tfrecord").write_bytes(frame_record(encode_example({"input_ids": np.arange(3)})))
    d = _valid_dict()
    d["shards"][0]["path"] = "../secret.tfrecord"
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(d))
    assert cli_main(["inspect", str(tmp_path / "ds")]) == 2
    assert "shards[0].path '../secret.tfrecord'" in capsys.readouterr().err
