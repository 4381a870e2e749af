"""The trainer's data guards, each on its own (no ../shared/data: the synthetic datasets of
tests/trainer_fixtures.py): the size check, the record-count check, the offsets cache keyed by the file itself,
and the contract checked against its limits and against the first record before any model is built."""
from __future__ import annotations

import json
import os

import pytest

from model_contract import frame_record
from model_contract.tfrecord import read_records
from tests.trainer_fixtures import write_dataset
from trainer.config import DataConfig, model_config
from trainer.data import ShardLoader
from trainer.dataset import open_dataset
from trainer.shard_files import DataIntegrityError, shard_offsets

CFG = model_config("tiny", seq_len=32, vocab_size=64, n_layers=2, d_model=32, n_heads=2)
SHARD1 = "gen-test/train-00001-of-00003.tfrecord"


@pytest.fixture()
def dataset(tmp_path):
    return write_dataset(str(tmp_path / "ds"), seq_len=32, vocab=64, n_docs=200)


def _loader(d, index_dir=None):
    manifest, mfile = open_dataset(DataConfig(path=d), CFG)
    return ShardLoader(manifest, mfile, DataConfig(path=d, streams=2, shuffle_buffer=4), 32, 4,
                       index_dir=index_dir)


def _edit_manifest(d, edit):
    path = os.path.join(d, "manifest.json")
    m = json.loads(open(path).read())
    edit(m)
    open(path, "w").write(json.dumps(m))


def test_same_record_count_other_size_is_refused_by_the_size_check(dataset):
    """Shard 1 with one record replaced by a longer valid one: the count agrees, only the size check can tell
    (shard 1, not 0: the first-record check reads shard 0 through the checked reader)."""
    path = os.path.join(dataset, SHARD1)
    records = list(read_records(path))
    others = list(read_records(os.path.join(dataset, "gen-test/train-00002-of-00003.tfrecord")))
    longer = next(r for r in others if len(r) != len(records[0]))
    open(path, "wb").write(b"".join(frame_record(r) for r in [longer] + records[1:]))
    with pytest.raises(DataIntegrityError, match=f"shard {SHARD1}: \\d+ bytes, the manifest says"):
        _loader(dataset)


def test_examples_off_by_one_with_bytes_right_is_refused_by_the_count_check(dataset, tmp_path):
    def one_more(m):
        m["shards"][1]["examples"] += 1  # not the first shard: the first-record check reads shard 0

    _edit_manifest(dataset, one_more)
    with pytest.raises(DataIntegrityError, match="shard gen-test/train-00001-of-00003.tfrecord: \\d+ records, "
                                                 "the manifest says"):
        _loader(dataset, index_dir=str(tmp_path / "idx"))


def test_offsets_cache_is_keyed_by_the_file_not_only_the_manifest(dataset, tmp_path):
    """Offsets cached from the intact shard must not be used for the file cut afterwards."""
    from trainer.dataset import read_manifest

    index_dir = str(tmp_path / "idx")
    _loader(dataset, index_dir=index_dir).close()  # caches every shard's offsets
    manifest, mfile = read_manifest(DataConfig(path=dataset))
    info = manifest.shards[0]
    path = os.path.join(dataset, info.path)
    data = open(path, "rb").read()
    open(path + ".cut", "wb").write(data[:100])
    os.replace(path + ".cut", path)  # what a copy tool does: a new file under the old name
    with pytest.raises((DataIntegrityError, ValueError)):
        shard_offsets(path, info, index_dir)  # the size check is not asked here: only the cache key can tell


@pytest.mark.parametrize("field,value", [("seq_len", 100_000_000), ("vocab_size", 2_000_000_000)])
def test_contract_beyond_the_limits_is_refused_in_one_line_before_the_model(dataset, field, value):
    def huge(m):
        if field == "seq_len":
            m["contract"]["seq_len"] = value
        else:
            m["contract"]["tokenizer"]["vocab_size"] = value

    _edit_manifest(dataset, huge)
    model = model_config("tiny", seq_len=value if field == "seq_len" else 32,
                         vocab_size=value if field == "vocab_size" else 64, n_layers=2, d_model=32, n_heads=2)
    with pytest.raises(DataIntegrityError, match=f"contract [a-z_.]*{field} {value} is outside") as e:
        open_dataset(DataConfig(path=dataset), model)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("field,value,message", [("seq_len", 64, "record 0 has 32 tokens, the contract's seq_len is 64"),
                                                 ("vocab_size", 8, "outside the contract's vocab_size 8")])
def test_contract_contradicted_by_the_first_record_is_refused(dataset, field, value, message):
    def lie(m):
        if field == "seq_len":
            m["contract"]["seq_len"] = value
            for f in m["contract"]["features"]:
                if f.get("shape"):
                    f["shape"] = [value]
        else:
            m["contract"]["tokenizer"]["vocab_size"] = value

    _edit_manifest(dataset, lie)
    model = model_config("tiny", seq_len=value if field == "seq_len" else 32,
                         vocab_size=64, n_layers=2, d_model=32, n_heads=2)
    with pytest.raises(DataIntegrityError, match=message):
        open_dataset(DataConfig(path=dataset), model)


def test_trainer_cli_refuses_a_huge_vocab_in_one_line(dataset, capfd):
    from trainer.train import main

    _edit_manifest(dataset, lambda m: m["contract"]["tokenizer"].update(vocab_size=2_000_000_000))
    assert main(["--data", dataset, "--model", "tiny", "--steps", "1", "--global-batch", "4", "--device",
                 "cpu"]) == 2
    err = capfd.readouterr().err
    assert "vocab_size 2000000000 is outside" in err and len(err.strip().splitlines()) == 1


def test_trainer_cli_refuses_a_contract_whose_model_exceeds_the_host_by_the_plan(dataset, capfd, monkeypatch):
    """A vocab within trainer/dataset.py's limits still sizes a model past this host's memory: the plan refuses it
    in one line before any allocation (tiny model: 2 x 16M x d_model embedding + head with AdamW state)."""
    from trainer import args, train

    _edit_manifest(dataset, lambda m: m["contract"]["tokenizer"].update(vocab_size=16_000_000))
    monkeypatch.setattr(args, "host_memory_bytes", lambda: 8 * 2**30)  # a small host, whatever runs the test
    assert train.main(["--data", dataset, "--model", "tiny", "--steps", "1", "--global-batch", "4", "--device",
                       "cpu"]) == 2
    err = capfd.readouterr().err
    assert "exceeds this host's 8.0 GiB" in err and "vocab 16000000" in err and len(err.strip().splitlines()) == 1


class _Unsized:
    """A stream that cannot tell its size (an object-store body): the checks happen as it is read."""

    def __init__(self, data: bytes):
        import io

        self._f = io.BytesIO(data)

    def read(self, n=-1):
        return self._f.read(n)


@pytest.mark.parametrize("sized", [True, False])
def test_checked_reader_refuses_size_and_count_by_shard_name(dataset, sized):
    import dataclasses
    import io

    from model_contract.checked_reader import ShardMismatchError, iter_checked_records
    from trainer.dataset import read_manifest

    manifest, _ = read_manifest(DataConfig(path=dataset))
    info = manifest.shards[1]
    data = open(os.path.join(dataset, info.path), "rb").read()

    def stream(b):
        return io.BytesIO(b) if sized else _Unsized(b)

    assert sum(1 for _ in iter_checked_records(stream(data), info)) == info.examples
    more = dataclasses.replace(info, examples=info.examples + 1)  # bytes right, count off by one
    with pytest.raises(ShardMismatchError, match=f"shard {SHARD1}: {info.examples} records, the manifest says"):
        list(iter_checked_records(stream(data), more))
    fewer = dataclasses.replace(info, examples=info.examples - 1)
    with pytest.raises(ShardMismatchError, match="at least"):
        list(iter_checked_records(stream(data), fewer))
    other = dataclasses.replace(info, bytes=info.bytes + 1)  # count right, size off by one
    with pytest.raises(ShardMismatchError, match=f"shard {SHARD1}: {info.bytes} bytes, the manifest says"):
        list(iter_checked_records(stream(data), other))


def test_trainer_refuses_a_checkpoint_dir_holding_a_pileprep_output(dataset, capfd):
    """--checkpoint-dir naming the dataset wrote step_*/, latest and the offsets cache among its files (exit 0);
    trainer/args.py `check_checkpoint_dir` refuses any directory with a manifest.json, before any work."""
    from trainer.train import main

    before = sorted(os.listdir(dataset))
    assert main(["--data", dataset, "--model", "tiny", "--steps", "1", "--global-batch", "4", "--device", "cpu",
                 "--checkpoint-dir", dataset]) == 2
    err = capfd.readouterr().err
    assert f"--checkpoint-dir {dataset}: it holds a pileprep output" in err and len(err.strip().splitlines()) == 1
    assert sorted(os.listdir(dataset)) == before
