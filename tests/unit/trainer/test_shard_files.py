"""trainer/shard_files.py: the shard guards, each on its own (no ../shared/data: the synthetic datasets of
tests/trainer_fixtures.py): the size check, the record-count check, the offsets cache keyed by the file itself
and walked once, damaged and same-size replaced shards, and shard paths kept inside the dataset."""
from __future__ import annotations

import json
import os

import pytest
import torch

from model_contract import frame_record
from model_contract.tfrecord import read_records
from tests.trainer_fixtures import batch_ids as _ids, edit_manifest, loader_of as _loader, write_dataset
from trainer.config import DataConfig, model_config
from trainer.data import ShardLoader
from trainer.dataset import open_dataset
from trainer.shard_files import DataIntegrityError, shard_offsets

torch.set_num_threads(1)


SMALL_CFG = model_config("tiny", seq_len=32, vocab_size=64, n_layers=2, d_model=32, n_heads=2)
SHARD1 = "gen-test/train-00001-of-00003.tfrecord"
CFG = model_config("tiny", seq_len=32, vocab_size=64, n_layers=3, d_model=32, n_heads=2)


def _small_loader(d, index_dir=None):
    manifest, mfile = open_dataset(DataConfig(path=d), SMALL_CFG)
    return ShardLoader(manifest, mfile, DataConfig(path=d, streams=2, shuffle_buffer=4), 32, 4,
                       index_dir=index_dir)


def test_same_record_count_other_size_is_refused_by_the_size_check(dataset):
    """Shard 1 with one record replaced by a longer valid one: the count agrees, only the size check can tell
    (shard 1, not 0: the first-record check reads shard 0 through the checked reader)."""
    path = os.path.join(dataset, SHARD1)
    records = list(read_records(path))
    others = list(read_records(os.path.join(dataset, "gen-test/train-00002-of-00003.tfrecord")))
    longer = next(r for r in others if len(r) != len(records[0]))
    open(path, "wb").write(b"".join(frame_record(r) for r in [longer] + records[1:]))
    with pytest.raises(DataIntegrityError, match=f"shard {SHARD1}: \\d+ bytes, the manifest says"):
        _small_loader(dataset)


def test_examples_off_by_one_with_bytes_right_is_refused_by_the_count_check(dataset, tmp_path):
    def one_more(m):
        m["shards"][1]["examples"] += 1  # not the first shard: the first-record check reads shard 0

    edit_manifest(dataset, one_more)
    with pytest.raises(DataIntegrityError, match="shard gen-test/train-00001-of-00003.tfrecord: \\d+ records, "
                                                 "the manifest says"):
        _small_loader(dataset, index_dir=str(tmp_path / "idx"))


def test_offsets_cache_is_keyed_by_the_file_not_only_the_manifest(dataset, tmp_path):
    """Offsets cached from the intact shard must not be used for the file cut afterwards."""
    from trainer.dataset import read_manifest

    index_dir = str(tmp_path / "idx")
    _small_loader(dataset, index_dir=index_dir).close()  # caches every shard's offsets
    manifest, mfile = read_manifest(DataConfig(path=dataset))
    info = manifest.shards[0]
    path = os.path.join(dataset, info.path)
    data = open(path, "rb").read()
    open(path + ".cut", "wb").write(data[:100])
    os.replace(path + ".cut", path)  # what a copy tool does: a new file under the old name
    with pytest.raises((DataIntegrityError, ValueError)):
        shard_offsets(path, info, index_dir)  # the size check is not asked here: only the cache key can tell


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


def _shard(d, i=0, n=3):
    return os.path.join(d, "gen-test", f"train-{i:05d}-of-{n:05d}.tfrecord")


def _records(path):
    from model_contract.tfrecord import read_records
    return list(read_records(path))


def _damaged(tmp_path, how):
    """A fresh dataset with shard 0 damaged in one of the ways a copy goes wrong."""
    from model_contract import frame_record
    d = write_dataset(str(tmp_path / how), seq_len=32, vocab=64, n_docs=200)
    path = _shard(d)
    if how == "cut":  # a copy that stopped at a record boundary: every record left is intact
        recs = _records(path)
        open(path, "wb").write(b"".join(frame_record(r) for r in recs[:-3]))
    elif how == "empty":
        open(path, "wb").close()
    elif how == "swapped":  # another valid shard of the dataset in its place
        assert os.path.getsize(_shard(d, 1)) != os.path.getsize(path)
        open(path, "wb").write(open(_shard(d, 1), "rb").read())
    elif how == "reordered":  # same size, same record count, valid framing: only the sha256 tells
        recs = _records(path)
        open(path, "wb").write(b"".join(frame_record(r) for r in reversed(recs)))
    return d


@pytest.mark.parametrize("how", ["cut", "empty", "swapped"])
def test_damaged_shard_is_refused_on_open_naming_it(tmp_path, how):
    from trainer.shard_files import DataIntegrityError
    d = _damaged(tmp_path, how)
    with pytest.raises(DataIntegrityError, match="shard gen-test/train-00000-of-00003.tfrecord: .* manifest says"):
        _loader(d, streams=2)


def test_verify_data_catches_a_same_size_replacement(tmp_path):
    from trainer.shard_files import prepare_shards
    d = _damaged(tmp_path, "reordered")
    manifest, mfile = open_dataset(DataConfig(path=d), CFG)
    _loader(d, streams=2)  # size and record count agree: only the content hash can tell
    cfg = DataConfig(path=d, verify_data=True)
    errors = prepare_shards(manifest, mfile, cfg, str(tmp_path / "idx"))
    assert len(errors) == 1 and "shard gen-test/train-00000-of-00003.tfrecord: sha256" in errors[0]
    # once per shard per node: split over the node's ranks, every shard checked by exactly one of them
    split = [prepare_shards(manifest, mfile, cfg, str(tmp_path / "idx"), r, 2) for r in range(2)]
    assert sum(split, []) == errors and split[0] == errors  # shard 0 is local rank 0's


def test_shard_path_outside_the_dataset_is_refused(tmp_path, shared_dataset):
    import json
    from trainer.shard_files import DataIntegrityError
    d = tmp_path / "escape"
    d.mkdir()
    m = json.loads(open(os.path.join(shared_dataset, "manifest.json")).read())
    for shard in m["shards"]:  # every file exists, reached through `..`: only containment can refuse it
        shard["path"] = "../" + os.path.basename(shared_dataset) + "/" + shard["path"]
    (d / "manifest.json").write_text(json.dumps(m))
    # model_contract's one resolver refuses it when the manifest is read, naming the entry; the loader's own
    # containment check stays as a second line (DataIntegrityError) for manifests built in memory
    from model_contract import ContractError
    with pytest.raises((ContractError, DataIntegrityError),
                       match=r"(shards\[0\]\.path|shard) '\.\./.*(outside|escapes|not a relative path inside)"):
        _loader(str(d), streams=2)


def test_record_offsets_are_cached_once_and_reused(shared_dataset, tmp_path, monkeypatch):
    """The first loader walks each shard's headers once and caches the offsets; the next only reads the cache."""
    import trainer.shard_files as data
    walks = []
    real = data.record_offsets
    monkeypatch.setattr(data, "record_offsets", lambda f, **k: walks.append(k["name"]) or real(f, **k))
    manifest, mfile = open_dataset(DataConfig(path=shared_dataset), CFG)
    cfg = DataConfig(path=shared_dataset, streams=4, shuffle_buffer=16, index_dir=str(tmp_path / "idx"))
    a = ShardLoader(manifest, mfile, cfg, 32, 8)
    assert len(walks) == len(manifest.shards)
    b = ShardLoader(manifest, mfile, cfg, 32, 8)
    assert len(walks) == len(manifest.shards)
    assert [_ids(next(a)) for _ in range(3)] == [_ids(next(b)) for _ in range(3)]
    a.close()
    b.close()
