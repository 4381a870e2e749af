"""pipeline/ops/guards.py: the environment and input checks that fail a run early, each in one line."""
from __future__ import annotations

import json
import os

import pytest

from pipeline.errors import ConfigError, RunError
from pipeline.ops import guards
from tests.manifest_fixtures import GEN_A, GEN_B, GEN_C, make_manifest, make_shard


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
    m = make_manifest(GEN_A, [make_shard(GEN_A), make_shard(GEN_A, "train-00001-of-00001.tfrecord"),
                          make_shard(GEN_A, "val-00000-of-00001.tfrecord")])
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
    removed = guards.cleanup_abandoned(str(out), str(staging), make_manifest(GEN_A, [make_shard(GEN_A)]))
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


def test_tokenizer_train_reads_only_regular_files_with_the_compression_they_claim(tmp_path):
    """`tokenizer train --input` listed its glob unscreened: a FIFO or a link to /dev/zero blocked its sample's
    first read forever, a .bz2 was read as text. It screens as the shard job does (pipeline/ops/input_checks.py
    `readable_inputs`); `verify --inputs` too (tests/integration/tools/test_verify.py)."""
    import bz2
    import gzip

    from pipeline.tools.tokenizer_train import _list_inputs

    good = tmp_path / "a.jsonl"
    good.write_text('{"text": "hello"}\n')
    os.mkfifo(tmp_path / "fifo.jsonl")
    os.symlink("/dev/zero", tmp_path / "zero.jsonl")
    assert _list_inputs([str(tmp_path / "*")]) == [str(good)]
    with pytest.raises(ConfigError, match="no regular input file is left"):
        _list_inputs([str(tmp_path / "fifo.jsonl"), str(tmp_path / "zero.jsonl")])
    for name, data in [("b.jsonl", bz2.compress(b'{"text": "x"}\n')), ("c.jsonl.zst", gzip.compress(b"{}\n"))]:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ConfigError, match=rf"--input {tmp_path / name}: .*(bzip2|gzip)"):
            _list_inputs([str(tmp_path / name)])
