"""Formats out: `pileprep export --format parquet` and the torch IterableDataset over the shards."""
from __future__ import annotations

import collections
import json
import os
import unittest.mock

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader

from model_contract import decode_example, read_records
from pipeline.tools.export import export_parquet
from tests.export_fixtures import build_dataset
from trainer.iterable_dataset import ShardIterableDataset, batches_per_rank, split_work


@pytest.fixture(scope="module")
def dataset(tiny_tokenizer, tmp_path_factory):
    return build_dataset(tmp_path_factory, tiny_tokenizer, 300_000)


def test_parquet_export_reads_back_to_the_same_arrays(dataset, tmp_path):
    out, manifest = dataset
    result = export_parquet(str(out), str(tmp_path / "pq"), rows_per_group=50)
    assert [f["source_shard"] for f in result["files"]] == [s["path"] for s in manifest["shards"]]
    for f, shard in zip(result["files"], manifest["shards"]):
        parquet = pq.ParquetFile(tmp_path / "pq" / f["path"])
        assert parquet.metadata.num_rows == shard["examples"]
        assert parquet.metadata.num_row_groups == -(-shard["examples"] // 50)  # bounded: row groups of 50
        table = parquet.read()
        columns = table.to_pydict()
        for i, record in enumerate(read_records(str(out / shard["path"]))):
            ex = decode_example(record)
            for name, values in ex.items():
                assert np.array_equal(np.asarray(columns[name][i]), values), (shard["path"], i, name)
            assert (columns["split"][i], columns["shard"][i], columns["record"][i]) == (shard["split"],
                                                                                        shard["path"], i)
        assert table.schema.field("input_ids").type.value_type.bit_width == 32
    summary = json.loads((tmp_path / "pq" / "export.json").read_text())
    assert summary["generation"] == manifest["generation"] and sum(f["rows"] for f in summary["files"]) == sum(
        s["examples"] for s in manifest["shards"])


def test_cli_export(dataset, tmp_path, capsys):
    from pipeline import cli

    out, manifest = dataset
    assert cli.main(["export", str(out), "--format", "parquet", "--output", str(tmp_path / "x")]) == 0
    assert len(json.loads(capsys.readouterr().out)["files"]) == len(manifest["shards"])
    assert cli.main(["export", str(tmp_path / "missing")]) == 2
    assert "no manifest" in capsys.readouterr().err


@pytest.mark.parametrize("n,world,batch,workers", [(103, 3, 4, 2), (7, 2, 4, 3), (64, 4, 2, 5), (0, 1, 1, 1)])
def test_split_work_covers_each_position_at_most_once(n, world, batch, workers):
    seen = collections.Counter()
    for rank in range(world):
        taken = 0
        for w in range(workers):
            lo, hi = split_work(n, world, rank, batch, workers, w)
            assert (hi - lo) % batch == 0
            seen.update(range(lo, hi))
            taken += hi - lo
        assert taken == batches_per_rank(n, world, batch) * batch  # every rank: the same number of batches
    assert max(seen.values(), default=1) == 1
    assert sum(seen.values()) == n - n % (world * batch)  # the remainder rule: the tail that cannot fill a round
    assert all(pos < n - n % (world * batch) for pos in seen)


def _epoch(out, world, batch, workers, epoch=0, **kw):
    per_rank = []
    for rank in range(world):
        ds = ShardIterableDataset(str(out), "train", batch_size=batch, rank=rank, world_size=world, seed=3, **kw)
        ds.set_epoch(epoch)
        loader = DataLoader(ds, batch_size=batch, num_workers=workers)
        per_rank.append([b for b in loader])
    return per_rank


def test_iterable_dataset_splits_over_ranks_and_workers(dataset):
    out, manifest = dataset
    n = sum(s["examples"] for s in manifest["shards"] if s["split"] == "train")
    world, batch = 3, 4
    per_rank = _epoch(out, world, batch, workers=2)
    counts = [len(batches) for batches in per_rank]
    assert counts == [n // (world * batch)] * world
    assert all(b["input_ids"].shape == (batch, manifest["contract"]["seq_len"]) for r in per_rank for b in r)
    indices = torch.cat([b["index"] for r in per_rank for b in r]).tolist()
    assert len(indices) == len(set(indices)) == n - n % (world * batch)
    # the examples are the shards' own, in the epoch's shard order
    order = [s for s in manifest["shards"] if s["split"] == "train"]
    from trainer.iterable_dataset import epoch_shard_order

    records = [r for i in epoch_shard_order(len(order), 3, 0, True) for r in read_records(str(out / order[i]["path"]))]
    for b in per_rank[1]:
        for idx, ids in zip(b["index"].tolist(), b["input_ids"]):
            assert np.array_equal(decode_example(records[idx])["input_ids"], ids.numpy())
    # another epoch: another shard order, the same counts; no workers: the same examples for the rank
    again = _epoch(out, world, batch, workers=0, epoch=1)
    assert [len(r) for r in again] == counts
    single = _epoch(out, world, batch, workers=0)
    assert sorted(torch.cat([b["index"] for b in single[0]]).tolist()) == sorted(
        torch.cat([b["index"] for b in per_rank[0]]).tolist())


def test_iterable_dataset_rejects_bad_arguments(dataset):
    out, _ = dataset
    with pytest.raises(ValueError, match="rank"):
        ShardIterableDataset(str(out), "train", batch_size=2, rank=3, world_size=2)
    with pytest.raises(ValueError, match="no shards"):
        ShardIterableDataset(str(out), "nope", batch_size=2)


# ------------------------------------------------------------------- two generations, swapped shard files
@pytest.fixture(scope="module")
def two_generations(tiny_tokenizer, tmp_path_factory):
    from tests.generation_fixtures import two_generation_dataset

    return two_generation_dataset(tmp_path_factory.mktemp("export-gens"), tiny_tokenizer)


def test_export_of_two_generations_writes_one_file_per_shard(two_generations, tmp_path):
    out, manifest = two_generations
    result = export_parquet(str(out), str(tmp_path / "pq"))
    paths = [f["path"] for f in result["files"]]
    assert len(set(paths)) == len(paths) == len(manifest["shards"])
    listed = json.loads((tmp_path / "pq" / "export.json").read_text())["files"]
    for f, shard in zip(listed, manifest["shards"]):  # each file holds its own shard's rows, none overwritten
        table = pq.read_table(tmp_path / "pq" / f["path"])
        assert table.num_rows == f["rows"] == shard["examples"]
        assert set(table.column("shard").to_pylist()) == {shard["path"]}


def test_export_refuses_a_swapped_shard_by_name(two_generations, tmp_path, capsys):
    import shutil

    from pipeline import cli

    out, manifest = two_generations
    copy = tmp_path / "ds"
    shutil.copytree(out, copy)
    first, second = (copy / s["path"] for s in manifest["shards"][:2])
    shutil.copy(second, first)  # generation 1's shard replaced by generation 2's: still valid TFRecord
    assert cli.main(["export", str(copy), "--output", str(tmp_path / "pq")]) == 2
    err = capsys.readouterr().err
    assert manifest["shards"][0]["path"] in err and "the manifest says" in err and len(err.splitlines()) == 1
    assert not list((tmp_path / "pq").rglob("*.parquet"))  # nothing of the refused shard under a final name


def test_inspect_and_report_refuse_a_swapped_shard_by_name(two_generations, tmp_path, capsys):
    import shutil

    from pipeline import cli

    out, manifest = two_generations
    copy = tmp_path / "ds"
    shutil.copytree(out, copy)
    first, second = (copy / s["path"] for s in manifest["shards"][:2])
    shutil.copy(second, first)
    assert cli.main(["inspect", str(copy), "--examples", "1"]) == 2
    err = capsys.readouterr().err
    assert f"shard {manifest['shards'][0]['path']}: " in err and "the manifest says" in err
    assert cli.main(["inspect", str(out), "--examples", "1"]) == 0  # the intact dataset still inspects
    capsys.readouterr()
    # report decodes one example per split through the same checked reader (pipeline/tools/report.py)
    assert cli.main(["report", str(copy), "--output", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert f"shard {manifest['shards'][0]['path']}: " in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r.html").exists()


def test_trainer_readers_on_two_generations(two_generations, tmp_path):
    """The trainer's loader and the IterableDataset read every shard of both generations, checked."""
    from trainer.config import DataConfig, model_config
    from trainer.data import ShardLoader
    from trainer.dataset import open_dataset

    out, manifest = two_generations
    seq_len = manifest["contract"]["seq_len"]
    model = model_config("tiny", seq_len=seq_len, vocab_size=1024, n_layers=1, d_model=32, n_heads=2)
    m, mfile = open_dataset(DataConfig(path=str(out)), model)
    loader = ShardLoader(m, mfile, DataConfig(path=str(out), streams=2, shuffle_buffer=4), seq_len, 4,
                         index_dir=str(tmp_path / "idx"))
    assert loader.counts == [s["examples"] for s in manifest["shards"]]
    assert next(iter(loader))["input_ids"].shape == (4, seq_len)
    loader.close()
    ds = ShardIterableDataset(str(out), "train", batch_size=1)
    assert sum(1 for _ in ds) == sum(s["examples"] for s in manifest["shards"])


def test_iterable_dataset_refuses_a_swapped_shard_by_name(two_generations, tmp_path):
    import shutil

    from model_contract.checked_reader import ShardMismatchError

    out, manifest = two_generations
    copy = tmp_path / "ds"
    shutil.copytree(out, copy)
    first, second = (copy / s["path"] for s in manifest["shards"][:2])
    shutil.copy(second, first)
    with pytest.raises(ShardMismatchError, match=f"shard {manifest['shards'][0]['path']}: "):
        list(ShardIterableDataset(str(copy), "train", batch_size=1))


def test_export_and_report_never_write_into_another_output_or_over_the_users_files(dataset, tmp_path, capsys):
    """`export --output` onto a dataset put its Parquet files and export.json among the dataset's, and `report
    --output DATASET/manifest.json` replaced the manifest with the page (exit 0): neither writes into another
    kind of output or over a file it did not write (pipeline/tools/export.py, pipeline/tools/report.py)."""
    from pipeline import cli
    from tests.ops_fixtures import dataset_files

    out, _manifest = dataset
    before = dataset_files(out)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    refused = [(["export", str(out), "--output", str(out)], "it holds a dataset (manifest.json)"),
               (["export", str(out), "--output", str(mine)], "files pileprep did not create (notes.txt)"),
               (["export", str(out), "--output", str(mine / "notes.txt")], "it is a file"),
               (["report", str(out), "--output", str(out / "manifest.json")], "is not a pileprep report"),
               (["report", str(out), "--output", str(mine / "notes.txt")], "is not a pileprep report"),
               (["report", str(out), "--output", str(tmp_path / "fifo")], "not a regular file")]
    os.mkfifo(tmp_path / "fifo")  # reading it to see whether it is a report would block
    for args, why in refused:
        assert cli.main(args) == 2, args
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and f"--output {args[-1]}: " in err and why in err, (args, err)
    assert dataset_files(out) == before and sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    assert (mine / "notes.txt").read_text() == "my notes"
    from pipeline.ops import lock

    held = tmp_path / "held"
    with lock.OutputLock(str(held)).held():  # another export writing there (this process, alive)
        assert cli.main(["export", str(out), "--output", str(held)]) == 2
    err = capsys.readouterr().err
    assert "output is locked by" in err and len(err.splitlines()) == 1 and not list(held.rglob("*.parquet"))
    page = tmp_path / "r.html"
    for _ in range(2):  # a report replaces its own earlier page
        assert cli.main(["report", str(out), "--output", str(page)]) == 0, capsys.readouterr().err
    assert json.loads((out / "manifest.json").read_text())["kind"] == "dataset"


KILL_AT_SECOND_PARQUET_RENAME = """
import os, signal, sys
real_replace = os.replace
renames = []
def replace(src, dst, *a, **k):
    if str(dst).endswith(".parquet"):
        renames.append(dst)
        if len(renames) == 2:  # the first shard's file is in place, the second's is written under its temp name
            os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst, *a, **k)
os.replace = replace
from pipeline.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_killed_exports_temporaries_are_removed_by_the_next_export_and_nothing_else(dataset, tmp_path):
    """An export SIGKILLed mid-way left its `.parquet` temporaries in the output for good (and, killed before its
    export.json, an output the next export refused as "files pileprep did not create"). The next export, under the
    output's lock, removes exactly the temporaries an export writes (pipeline/tools/export.py
    `remove_abandoned_temporaries`): files of other names stay."""
    import signal
    import subprocess
    import sys

    from pipeline.ops import lock
    from tests.conftest import REPO
    from tests.ops_fixtures import run_cli, subprocess_env

    out, manifest = dataset
    pq_out = tmp_path / "pq"
    args = ["export", str(out), "--output", str(pq_out)]
    killed = subprocess.run([sys.executable, "-c", KILL_AT_SECOND_PARQUET_RENAME, *args], capture_output=True,
                            env=subprocess_env(PYTHONPATH=str(REPO)), cwd=str(REPO), timeout=120)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    temps = [p for p in pq_out.rglob("*") if p.name.endswith(".tmp")]
    assert len(temps) == 1 and temps[0].name.startswith(".") and not (pq_out / "export.json").exists()
    assert (pq_out / lock.LOCK_NAME).exists()  # a dead holder's: stale at once on this host
    # An export before the hidden temporary names left `<shard>.parquet.tmp`; files of other names are not its.
    legacy = temps[0].parent / "val-00000-of-00001.parquet.tmp"
    legacy.write_bytes(b"partial")
    others = [temps[0].parent / name for name in ("notes.parquet.tmp", "train-00000-of-00003.parquet.tmp.keep",
                                                  ".notes.parquet.tmp")]
    for p in others:
        p.write_bytes(b"mine")
    res = run_cli(args, timeout_s=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert not temps[0].exists() and not legacy.exists() and all(p.read_bytes() == b"mine" for p in others)
    listed = json.loads((pq_out / "export.json").read_text())["files"]
    assert [f["rows"] for f in listed] == [s["examples"] for s in manifest["shards"]]
    left = sorted(str(p.relative_to(pq_out)) for p in pq_out.rglob("*") if p.is_file())
    stamps = sorted({f"{f['path'].split('/')[0]}/.pileprep-generation" for f in listed})  # the export's own dirs
    assert left == sorted([f["path"] for f in listed] + ["export.json"] + stamps
                          + [str(p.relative_to(pq_out)) for p in others])  # no lock, no in-progress marker


@pytest.mark.formats
def test_shard_format_writes_the_exports_of_the_committed_generation(tiny_tokenizer, tmp_path, capsys):
    """`shard --format megatron,hf`: the TFRecord files, manifest config and generation of a run without --format;
    OUTPUT/megatron and OUTPUT/hf equal to `export` after the shard (sha256 of every file); an export killed after
    its first split resumes from that split's done marker when the same command runs again (nothing to do for the
    shard job); a bad value is exit 2, one line."""
    from pipeline import cli
    from pipeline.tools import export_formats
    from pipeline.tools.verify import verify
    from tests.corpus_fixtures import write_good_corpus
    from tests.export_fixtures import IN_MEMORY

    write_good_corpus(tmp_path / "in", limit_bytes=60_000)

    def shard(out, *formats):
        return cli.main(["shard", "--input", str(tmp_path / "in" / "*"), "--output", str(tmp_path / out),
                         "--tokenizer", tiny_tokenizer, "--seq-len", "128", "--num-shards", "1", "--val-fraction",
                         "0.2", "--test-fraction", "0.1", "--progress-every", "0", *formats, *IN_MEMORY])

    real_put = export_formats.SplitJob.put_many
    written = []

    splits = []

    def killed_in_the_second_split(self, names, fill):
        if self.split not in splits:
            splits.append(self.split)
        if len(splits) > 1:
            raise KeyboardInterrupt  # as a kill during the second split, the first one's done marker written
        return real_put(self, names, fill)

    with unittest.mock.patch.object(export_formats.SplitJob, "put_many", killed_in_the_second_split):
        assert shard("out", "--format", "megatron,hf") == 130
    out = tmp_path / "out"
    assert (out / "manifest.json").exists() and not (out / "megatron" / "export.json").exists()

    def counting(self, names, fill):
        written.extend((self.fmt, n) for n in names)
        return real_put(self, names, fill)

    capsys.readouterr()
    with unittest.mock.patch.object(export_formats.SplitJob, "put_many", counting):
        assert shard("out", "--format", "megatron,hf") == 0
    printed = capsys.readouterr().out
    assert "nothing to do" in printed and "--format megatron:" in printed and "--format hf:" in printed, printed
    megatron = [n for f, n in written if f == "megatron"]
    assert not any(n.startswith(f"{splits[0]}_") for n in megatron), written  # reused from its done marker
    assert f"{splits[1]}_text_document.bin" in megatron and any(f == "hf" for f, _ in written), written
    assert shard("plain") == 0  # the same run without --format
    plain, both = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("plain", "out"))
    assert [(s["path"], s["sha256"]) for s in both["shards"]] == [(s["path"], s["sha256"]) for s in plain["shards"]]
    assert (both["generation"], both["config"]) == (plain["generation"], plain["config"])
    assert not (tmp_path / "plain" / "megatron").exists()
    for fmt in ("megatron", "hf"):
        after = export_formats.export_format(str(tmp_path / "plain"), fmt, str(tmp_path / f"x-{fmt}"))
        summary = json.loads((out / fmt / "export.json").read_text())
        assert summary["files"] == after["files"] and summary["generation"] == after["generation"]
        assert verify(str(out / fmt)).ok
    assert shard("bad", "--format", "megatron,tfrecords") == 2
    err = capsys.readouterr().err
    assert "--format 'tfrecords'" in err and len(err.strip().splitlines()) == 1, err


# ------------------------------------------------------------------ issue 32's hostile review (export.py)
def _refused_in_one_line(cli, capsys, args) -> str:
    assert cli.main(args) == 2, args
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_export_takes_break_lock_as_its_lock_message_says(dataset, tmp_path, capsys):
    """The output-locked message tells the user to pass --break-lock; `pileprep export` did not accept it (an
    argparse error). It does now, with shard's meaning (the output's lock); the dataset's lock, which an export
    takes only to register its ref, names gc's --break-lock, the command that takes that lock."""
    from pipeline import cli
    from pipeline.ops import lock

    out, _manifest = dataset
    held = tmp_path / "held"
    with lock.OutputLock(str(held)).held():  # a live holder (this process): never stale
        err = _refused_in_one_line(cli, capsys, ["export", str(out), "--output", str(held)])
        assert "pass --break-lock" in err, err
        assert cli.main(["export", str(out), "--output", str(held), "--break-lock"]) == 0, capsys.readouterr().err
    assert json.loads((held / "export.json").read_text())["format"] == "parquet"
    with lock.OutputLock(str(out)).held():
        err = _refused_in_one_line(cli, capsys, ["export", str(out), "--output", str(tmp_path / "x"), "--break-lock"])
    assert f"`pileprep gc {out} --break-lock`" in err and not (tmp_path / "x").exists(), err


@pytest.mark.parametrize("fmt", ["parquet", "megatron"])
def test_a_malformed_or_foreign_export_json_is_refused_and_kept(dataset, tmp_path, capsys, fmt):
    """A malformed export.json was a traceback (exit 1); a user's own export.json was replaced by a Parquet
    export. Both: exit 2, one line naming the file and the problem, the file as it was, nothing written."""
    from pipeline import cli

    out, _manifest = dataset
    for content, problem in ((b'{"kind": "export", "format": ', "not readable JSON"),
                             (b'{"kind": "export", "format": "megatron", "generation": "g", "files": [], '
                              b'"previous": 7}', "previous 7 is not a list"),
                             (b'{"title": "my notes"}', 'not an export\'s record (no "kind": "export")')):
        target = tmp_path / f"{fmt}-{len(content)}"
        target.mkdir()
        (target / "export.json").write_bytes(content)
        err = _refused_in_one_line(cli, capsys, ["export", str(out), "--format", fmt, "--output", str(target)])
        assert f"{target / 'export.json'}: {problem}" in err, err
        assert sorted(p.name for p in target.iterdir()) == ["export.json"]
        assert (target / "export.json").read_bytes() == content


def test_an_export_of_another_format_is_refused_and_the_first_kept(dataset, tmp_path, capsys):
    """A Parquet export into a Megatron export's directory replaced its export.json (and the reverse was refused
    only after the ref was written): one output holds one export, each format goes to its own directory."""
    from pipeline import cli
    from pipeline.tools.verify import verify
    from tests.ops_fixtures import dataset_files

    out, _manifest = dataset
    target, pq_out = tmp_path / "megatron", tmp_path / "parquet"
    assert cli.main(["export", str(out), "--format", "megatron", "--output", str(target)]) == 0
    assert cli.main(["export", str(out), "--output", str(pq_out)]) == 0
    before = {path: dataset_files(path) for path in (target, pq_out, out)}  # out: the refs
    err = _refused_in_one_line(cli, capsys, ["export", str(out), "--format", "parquet", "--output", str(target)])
    assert "holds a megatron export; a parquet export goes to its own directory" in err, err
    err = _refused_in_one_line(cli, capsys, ["export", str(out), "--format", "hf", "--output", str(pq_out)])
    assert "holds a parquet export; a hf export goes to its own directory" in err, err
    assert {path: dataset_files(path) for path in before} == before and verify(str(target)).ok


def test_verify_of_a_parquet_export_finds_a_flipped_byte(dataset, tmp_path):
    """Parquet's export.json recorded no digests, so `pileprep verify` passed a changed file: every file's size
    and sha256 are recorded now, and hashed again."""
    from pipeline.tools.verify import verify

    out, _manifest = dataset
    summary = export_parquet(str(out), str(tmp_path / "pq"))
    assert all(isinstance(f["bytes"], int) and len(f["sha256"]) == 64 for f in summary["files"])
    assert verify(str(tmp_path / "pq")).ok
    name = summary["files"][0]["path"]
    target = tmp_path / "pq" / name
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 1
    target.write_bytes(bytes(data))
    report = verify(str(tmp_path / "pq"))
    assert not report.ok and [m for m in report.mismatches if m.startswith(f"{name}: sha256")], report.mismatches
    listed = json.loads((tmp_path / "pq" / "export.json").read_text())
    for row in listed["files"]:  # an export from before the digests: nothing to check against, said by name
        del row["bytes"], row["sha256"]
    (tmp_path / "pq" / "export.json").write_text(json.dumps(listed))
    report = verify(str(tmp_path / "pq"))
    assert not report.ok and f"{name}: export.json records no size and sha256" in " ".join(report.mismatches)


@pytest.mark.formats
def test_shard_format_break_lock_reaches_the_exports_locks(tiny_tokenizer, tmp_path, capsys):
    """`shard --format megatron` whose OUTPUT/megatron is locked said "pass --break-lock", and shard accepts it, but
    the exports after the job took their locks without it (export_after_shard.py): the same refusal again. The
    shard's --break-lock is the exports' too (each export's output is inside OUTPUT)."""
    from pipeline import cli
    from pipeline.ops import lock
    from tests.corpus_fixtures import write_good_corpus
    from tests.export_fixtures import IN_MEMORY

    write_good_corpus(tmp_path / "in", limit_bytes=40_000)
    out = tmp_path / "out"

    def shard(*extra):
        return cli.main(["shard", "--input", str(tmp_path / "in" / "*"), "--output", str(out), "--tokenizer",
                         tiny_tokenizer, "--seq-len", "128", "--num-shards", "1", "--val-fraction", "0.2",
                         "--test-fraction", "0.1", "--progress-every", "0", "--format", "megatron", *extra,
                         *IN_MEMORY])

    assert shard() == 0, capsys.readouterr().err
    with lock.OutputLock(str(out / "megatron")).held():  # a live holder (this process)
        assert shard() == 2
        err = capsys.readouterr().err
        assert f"--output {out / 'megatron'}: output is locked by" in err and "pass --break-lock" in err, err
        assert shard("--break-lock") == 0, capsys.readouterr().err
    assert json.loads((out / "megatron" / "export.json").read_text())["format"] == "megatron"


# ------------------------------------------------------------------ issue 32's second hostile review (review32b)
def _killed_in_the_second_split(fmt_module):
    """A patch of SplitJob.put_many that raises as a kill would once the first split's files are in place."""
    real_put = fmt_module.SplitJob.put_many
    splits: list = []

    def put_many(self, names, fill):
        if self.split and self.split not in splits:
            splits.append(self.split)
        if len(splits) > 1:
            raise KeyboardInterrupt
        return real_put(self, names, fill)
    return put_many


@pytest.mark.parametrize("first_by_source", [False, True])
def test_a_killed_export_is_not_taken_over_by_one_with_the_other_by_source(dataset, tmp_path, capsys,
                                                                           first_by_source):
    """A Megatron export killed before its export.json left a marker naming only its format: an export with the
    other --by-source then wrote into that output (exit 0), beside the killed one's `.bin/.idx` files, though a
    committed export with the other --by-source is refused (README "One output, one export")."""
    from pipeline import cli
    from pipeline.tools import export_formats

    out, _manifest = dataset
    target = tmp_path / "m"
    with unittest.mock.patch.object(export_formats.SplitJob, "put_many", _killed_in_the_second_split(export_formats)):
        with pytest.raises(KeyboardInterrupt):
            export_formats.export_format(str(out), "megatron", str(target), by_source=first_by_source)
    before = sorted(str(p.relative_to(target)) for p in target.rglob("*"))
    other = [] if first_by_source else ["--by-source"]
    err = _refused_in_one_line(cli, capsys, ["export", str(out), "--format", "megatron", "--output", str(target),
                                             *other])
    assert "killed megatron export" in err and "--by-source" in err, err
    assert sorted(str(p.relative_to(target)) for p in target.rglob("*")) == before
    same = ["--by-source"] if first_by_source else []  # the same export resumes
    assert cli.main(["export", str(out), "--format", "megatron", "--output", str(target), *same]) == 0
    assert json.loads((target / "export.json").read_text()).get("by_source", False) == first_by_source


@pytest.mark.parametrize("fmt", ["hf", "parquet", "megatron"])
def test_verify_of_an_export_finds_a_file_export_json_does_not_list(dataset, tmp_path, fmt):
    """`pileprep verify` hashed the files export.json lists and nothing else: a file added beside them passed (OK),
    though readers take it (the HF card's `data/train-*`, a Parquet glob, a Megatron prefix). A file in a directory
    of the export that export.json does not list is a mismatch by name; the generation stamp is the export's own."""
    from pipeline.tools import export_formats
    from pipeline.tools.verify import verify

    out, _manifest = dataset
    target = tmp_path / fmt
    if fmt == "parquet":
        summary = export_parquet(str(out), str(target))
    else:
        summary = export_formats.export_format(str(out), fmt, str(target))
    assert verify(str(target)).ok
    first = target / summary["files"][0]["path"]
    extra = first.parent / ("train-00009-of-00009" + first.suffix)  # a name the readers' patterns take
    extra.write_bytes(first.read_bytes())
    report = verify(str(target))
    rel = str(extra.relative_to(target))
    assert not report.ok and [m for m in report.mismatches if m.startswith(f"{rel}: ")
                              and "not listed in export.json" in m], report.mismatches


def _new_generation(dataset_dir, seq_len: int) -> str:
    """Commit another configuration over `dataset_dir` (--overwrite): a new generation; its name."""
    from pipeline.config import ShardConfig
    from pipeline.shard import shard_pipeline
    from tests.export_fixtures import IN_MEMORY

    config = json.loads((dataset_dir / "manifest.json").read_text())["config"]
    new = ShardConfig(inputs=tuple(config["inputs"]), output=str(dataset_dir), tokenizer=config["tokenizer"],
                      seq_len=seq_len, num_shards=3, val_fraction=0.05, test_fraction=0.05, overwrite=True)
    return shard_pipeline.run(new, IN_MEMORY, progress_every_s=0)["generation"]


def test_a_parquet_export_of_a_new_generation_keeps_the_previous_and_removes_older(dataset, tmp_path):
    """A Parquet export again after the dataset committed a new generation (non-incremental) left every earlier
    generation's Parquet files in the output for good: export.json named only the newest, nothing was ever removed
    (three generations after two re-exports). As the other formats: the previous one kept for readers (named in
    `previous`), the one before it removed (only a directory the export created and stamped)."""
    import shutil

    from pipeline.tools.export_summary import GENERATION_STAMP
    from pipeline.tools.verify import verify

    out, manifest = dataset
    copy = tmp_path / "ds"
    shutil.copytree(out, copy)
    target = tmp_path / "pq"
    first = export_parquet(str(copy), str(target))["generation"]
    mine = target / "gen-0123456789abcdef"  # a directory of the user's in the output: never removed
    mine.mkdir()
    (mine / "train-00000-of-00001.parquet").write_bytes(b"mine")
    second = _new_generation(copy, 64)
    summary = export_parquet(str(copy), str(target))
    assert summary["generation"] == second and summary["previous"] == [first]
    assert (target / first).is_dir() and verify(str(target)).ok  # a reader of the first may still read it
    third = _new_generation(copy, 96)
    summary = export_parquet(str(copy), str(target))
    assert summary["generation"] == third and summary["previous"] == [second]
    assert not (target / first).exists() and (target / second / GENERATION_STAMP).is_file()
    assert (mine / "train-00000-of-00001.parquet").read_bytes() == b"mine"
    assert sorted(p.name for p in target.iterdir()) == sorted(["export.json", second, third, mine.name])


def test_exports_of_one_dataset_at_once_wait_for_each_others_ref(dataset, tmp_path, capsys):
    """Three exports of one dataset started together (each to its own output): one or two exited 2 "output is
    locked ... another run is writing it", because another held the dataset's lock for the milliseconds its ref
    takes. An export waits a bounded while for the dataset's lock; a holder that keeps it (a shard run) is still
    refused in one line."""
    import threading

    from pipeline import cli
    from pipeline.ops import lock
    from pipeline.tools import export

    out, _manifest = dataset
    released = threading.Event()

    def hold_briefly():
        with lock.OutputLock(str(out)).held():  # as another export registering its ref
            taken.set()
            released.wait(timeout=0.5)
    taken = threading.Event()
    holder = threading.Thread(target=hold_briefly)
    holder.start()
    taken.wait(timeout=10)
    try:
        assert cli.main(["export", str(out), "--format", "megatron", "--output", str(tmp_path / "m")]) == 0, (
            capsys.readouterr().err)
    finally:
        released.set()
        holder.join()
    with lock.OutputLock(str(out)).held(), unittest.mock.patch.object(export, "DATASET_LOCK_WAIT_S", 0.3):
        err = _refused_in_one_line(cli, capsys, ["export", str(out), "--output", str(tmp_path / "p")])
    assert "output is locked by" in err and not (tmp_path / "p").exists(), err


@pytest.mark.parametrize("place", ["{gen}/megatron", "generations/megatron", ".refs/megatron", "_staging/megatron"])
def test_an_export_into_the_datasets_own_directories_is_refused(dataset, tmp_path, capsys, place):
    """`--output DATASET/<generation>/x` (or generations/, _staging/) was accepted: the export's files sat among
    the dataset's, and once a re-export moved its ref to a newer generation, `pileprep gc` removed the older
    generation directory and the whole export with it. An export inside the dataset goes to a directory of its
    own beside them (DATASET/<format>, the default); these are refused, nothing written."""
    import shutil

    from pipeline import cli
    from tests.ops_fixtures import dataset_files

    out, manifest = dataset
    out = shutil.copytree(out, tmp_path / "ds")  # a copy: an export written into it must not reach other tests
    before = dataset_files(out)
    target = out / place.format(gen=manifest["generation"])
    existed = target.exists()
    err = _refused_in_one_line(cli, capsys, ["export", str(out), "--format", "megatron", "--output", str(target)])
    assert f"--output {target}: " in err and "inside the dataset's" in err, err
    assert dataset_files(out) == before and target.exists() == existed


def test_verify_of_an_export_never_reads_export_json_through_a_link(dataset, tmp_path):
    """A link in place of export.json (to another output's record) was followed: verify checked that record and
    said OK. Every other path inside the output is refused through a link (export_verify.py `_inside`); export.json
    too, and a link among the export's files that export.json does not list."""
    import shutil

    from pipeline.tools import export_formats
    from pipeline.tools.verify import verify

    out, _manifest = dataset
    first = tmp_path / "a"
    summary = export_formats.export_format(str(out), "mds", str(first))
    second = tmp_path / "b"
    shutil.copytree(first, second)
    (second / "export.json").unlink()
    (second / "export.json").symlink_to(first / "export.json")
    report = verify(str(second))
    assert not report.ok and [m for m in report.mismatches if "export.json" in m and "symbolic link" in m], (
        report.mismatches)
    third = tmp_path / "c"
    shutil.copytree(first, third)
    listed = third / summary["files"][0]["path"]
    (listed.parent / "extra.mds").symlink_to(tmp_path / "elsewhere")  # dangling: never read
    report = verify(str(third))
    rel = str((listed.parent / "extra.mds").relative_to(third))
    assert not report.ok and [m for m in report.mismatches if m.startswith(f"{rel}: ") and "symbolic link" in m], (
        report.mismatches)


@pytest.mark.parametrize("fmt", ["parquet", "megatron"])
def test_a_directory_in_place_of_the_in_progress_marker_is_refused_before_the_ref(dataset, tmp_path, capsys, fmt):
    """A directory named `.pileprep-export-in-progress` made the output pass as an export's own; the export then
    wrote its ref into the dataset and failed writing the marker ("[Errno 21] Is a directory"): a refused export
    that changed the dataset. It is refused as a malformed export.json is: one line naming it, nothing written."""
    from pipeline import cli
    from pipeline.tools.export_summary import IN_PROGRESS_MARKER
    from tests.ops_fixtures import dataset_files

    out, _manifest = dataset
    before = dataset_files(out)
    target = tmp_path / "o"
    (target / IN_PROGRESS_MARKER).mkdir(parents=True)
    err = _refused_in_one_line(cli, capsys, ["export", str(out), "--format", fmt, "--output", str(target)])
    assert f"{target / IN_PROGRESS_MARKER}: " in err and "Errno" not in err, err
    assert dataset_files(out) == before and [p.name for p in target.iterdir()] == [IN_PROGRESS_MARKER]


def test_a_parquet_re_export_refuses_a_file_in_place_of_its_generation_directory(dataset, tmp_path, capsys):
    """A file where a Parquet export's generation directory was: the export again failed with a raw "[Errno 17]
    File exists" once its ref was written; the other formats refuse it in one line naming it (export_formats.py
    `_plan`). Now Parquet too, before the ref, nothing written."""
    from pipeline import cli
    from tests.ops_fixtures import dataset_files

    out, manifest = dataset
    target = tmp_path / "pq"
    export_parquet(str(out), str(target))
    gen = target / manifest["generation"]
    import shutil

    shutil.rmtree(gen)
    gen.write_text("mine")
    before = {path: dataset_files(path) for path in (out, target)}
    err = _refused_in_one_line(cli, capsys, ["export", str(out), "--output", str(target)])
    assert f"{gen}: " in err and "Errno" not in err, err
    assert {path: dataset_files(path) for path in before} == before


def test_a_killed_exports_generation_is_removed_once_a_later_one_commits(dataset, tmp_path):
    """An export killed while writing a new generation left that generation's directory; once the dataset moved on
    and the export ran again, export.json never named it (neither `generation` nor `previous`), so no later export
    removed it: one stale directory per killed export, for good. A directory the export created (its stamp inside)
    that the committed export.json does not keep is removed with the older generations; a user's stays."""
    import shutil

    from pipeline.tools import export_formats

    out, _manifest = dataset
    copy = tmp_path / "ds"
    shutil.copytree(out, copy)
    target = tmp_path / "m"
    first = export_formats.export_format(str(copy), "megatron", str(target))["generation"]
    killed = _new_generation(copy, 64)
    with unittest.mock.patch.object(export_formats.SplitJob, "put_many", _killed_in_the_second_split(export_formats)):
        with pytest.raises(KeyboardInterrupt):
            export_formats.export_format(str(copy), "megatron", str(target))
    assert (target / killed).is_dir()
    mine = target / "gen-0123456789abcdef"  # the user's, unstamped
    mine.mkdir()
    third = _new_generation(copy, 96)
    summary = export_formats.export_format(str(copy), "megatron", str(target))
    assert summary["generation"] == third and summary["previous"] == [first]
    assert not (target / killed).exists() and mine.is_dir()
    assert sorted(p.name for p in target.iterdir()) == sorted(["export.json", first, third, mine.name])


@pytest.mark.parametrize("through_link", [False, True])
def test_an_export_into_another_exports_generation_directory_is_refused(dataset, tmp_path, capsys, through_link):
    """`--output A/<generation>/hf` inside export A's generation directory was accepted: A's next export after a new
    dataset generation removes that directory (its own, stamped) with the other export inside. Refused in one
    line, nothing written."""
    from pipeline import cli
    from pipeline.tools import export_formats
    from tests.ops_fixtures import dataset_files

    out, manifest = dataset
    first = tmp_path / "a"
    export_formats.export_format(str(out), "megatron", str(first))
    before = {path: dataset_files(path) for path in (out, first)}
    target = first / manifest["generation"] / "hf"
    named = target
    if through_link:  # --output a link (the operator's own name for it) to a directory inside A's generation
        (first / manifest["generation"] / "sub").mkdir()
        target = first / manifest["generation"] / "sub"
        named = tmp_path / "link"
        named.symlink_to(target)
        before[first] = dataset_files(first)
    err = _refused_in_one_line(cli, capsys, ["export", str(out), "--format", "hf", "--output", str(named)])
    assert f"--output {named}: " in err and "generation directory of another export" in err, err
    assert {path: dataset_files(path) for path in before} == before and not list(target.glob("*"))
