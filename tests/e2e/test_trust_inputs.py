"""Inputs that are not what they claim (the shard job, in process, with the tiny tokenizer; no ../shared/data):
a FIFO or a symlink to /dev/zero is skipped, not read; the output inside the input glob is never read; a
compression its name does not announce is refused by name; a file changed after listing fails the run naming it
with nothing committed."""
from __future__ import annotations

import bz2
import gzip
import lzma
import os

import pytest

from pipeline.config import ShardConfig
from pipeline.errors import ConfigError
from pipeline.ops import guards
from pipeline.shard import shard_pipeline
from tests.corpus_fixtures import good_documents, pile_line, write_zst
from tests.ops_fixtures import FAST_LOCAL

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def lines():
    return [pile_line(t, s) for t, s in good_documents(40_000)]


def _config(inputs, out, tokenizer) -> ShardConfig:
    return ShardConfig(inputs=tuple(inputs), output=str(out), tokenizer=tokenizer, seq_len=128, num_shards=1,
                       val_fraction=0.0, test_fraction=0.0)


def _run(cfg, **kw):
    return shard_pipeline.run(cfg, FAST_LOCAL, progress_every_s=0, **kw)


def test_fifo_and_symlink_to_dev_zero_are_skipped_not_read(tmp_path, lines, tiny_tokenizer):
    inbox = tmp_path / "in"
    inbox.mkdir()
    write_zst(inbox / "00.jsonl.zst", lines)
    os.mkfifo(inbox / "01-fifo.jsonl")
    os.symlink("/dev/zero", inbox / "02-zero.jsonl")
    manifest = _run(_config([str(inbox / "*")], tmp_path / "ds", tiny_tokenizer))  # hangs without the screen
    assert [r["path"] for r in manifest["ledger"]] == [str(inbox / "00.jsonl.zst")]
    skipped = {r["path"]: r["reason"] for r in manifest["skipped_inputs"]}
    assert skipped == {str(inbox / "01-fifo.jsonl"): "not_a_regular_file",
                       str(inbox / "02-zero.jsonl"): "not_a_regular_file"}


def test_only_unreadable_kinds_matched_is_a_config_error(tmp_path, tiny_tokenizer):
    os.mkfifo(tmp_path / "only.jsonl")
    with pytest.raises(ConfigError, match="no regular input file"):
        _run(_config([str(tmp_path / "*.jsonl")], tmp_path / "ds", tiny_tokenizer))


def test_output_inside_the_input_glob_is_never_read(tmp_path, lines, tiny_tokenizer):
    root = tmp_path / "data"
    root.mkdir()
    write_zst(root / "00.jsonl.zst", lines)
    cfg = _config([str(root / "**")], root / "ds", tiny_tokenizer)
    first = _run(cfg, incremental_run=True)
    assert [r["path"] for r in first["ledger"]] == [str(root / "00.jsonl.zst")]
    again = _run(cfg, incremental_run=True)  # its own lock and shards are under the glob now: not inputs
    assert [r["path"] for r in again["ledger"]] == [str(root / "00.jsonl.zst")]
    rebuilt = _run(cfg)  # a full rebuild does not read its own shards either
    assert [r["path"] for r in rebuilt["ledger"]] == [str(root / "00.jsonl.zst")]
    assert rebuilt["records"]["read"] == first["records"]["read"]
    assert any(r["reason"] == "inside_output" for r in rebuilt["skipped_inputs"])


@pytest.mark.parametrize("name,compress", [("x.jsonl.bz2", bz2.compress), ("x.jsonl.xz", lzma.compress),
                                           ("x.jsonl.zst", gzip.compress), ("x.jsonl", gzip.compress)])
def test_compression_the_name_does_not_announce_is_refused_by_name(tmp_path, lines, tiny_tokenizer, name,
                                                                   compress):
    inbox = tmp_path / "in"
    inbox.mkdir()
    write_zst(inbox / "00.jsonl.zst", lines)
    (inbox / name).write_bytes(compress(b"".join(lines)))
    with pytest.raises(ConfigError, match=rf"{name}: named as .* but its bytes are"):
        _run(_config([str(inbox / "*")], tmp_path / "ds", tiny_tokenizer))
    assert not (tmp_path / "ds" / "manifest.json").exists()


@pytest.mark.parametrize("change", ["append", "truncate"])
def test_input_changed_after_listing_fails_naming_it_and_commits_nothing(tmp_path, lines, tiny_tokenizer,
                                                                         monkeypatch, change):
    inbox = tmp_path / "in"
    inbox.mkdir()
    victim = inbox / "00.jsonl"
    victim.write_bytes(b"".join(lines))
    sample = guards.sample_text_field

    def change_then_sample(paths, *a, **kw):  # runs on the driver after the listing, before any worker reads
        if change == "append":
            with open(victim, "ab") as f:
                f.write(lines[0])
        else:
            os.truncate(victim, victim.stat().st_size // 2)
        return sample(paths, *a, **kw)

    monkeypatch.setattr(guards, "sample_text_field", change_then_sample)
    with pytest.raises(Exception, match=rf"{victim}: listed with \d+ bytes but \d+ bytes were read"):
        _run(_config([str(inbox / "*")], tmp_path / "ds", tiny_tokenizer))
    ds = tmp_path / "ds"
    assert not (ds / "manifest.json").exists()
    # What the failed run kept for a rerun (its marked units and shards, docs/OPERATIONS.md "Resume") lies in its
    # partial generation, which no manifest names; the rerun lists the file as it now is, another input ledger,
    # so it discards all of it with a note and commits only its own shards.
    monkeypatch.undo()
    manifest = _run(_config([str(inbox / "*")], ds, tiny_tokenizer))
    assert {str(p.relative_to(ds)) for p in ds.rglob("*.tfrecord")} == {s["path"] for s in manifest["shards"]}
    assert [r["bytes"] for r in manifest["ledger"]] == [victim.stat().st_size]


def test_input_deleted_after_listing_fails_naming_it_and_commits_nothing(tmp_path, lines, tiny_tokenizer,
                                                                         monkeypatch):
    inbox = tmp_path / "in"
    inbox.mkdir()
    victim = inbox / "00.jsonl"
    victim.write_bytes(b"".join(lines))
    sample = guards.sample_text_field

    def sample_then_delete(paths, *a, **kw):
        result = sample(paths, *a, **kw)
        os.remove(victim)
        return result

    monkeypatch.setattr(guards, "sample_text_field", sample_then_delete)
    with pytest.raises(FileNotFoundError, match=str(victim)):
        _run(_config([str(inbox / "*")], tmp_path / "ds", tiny_tokenizer))
    assert not (tmp_path / "ds" / "manifest.json").exists()
