"""trainer/data.py (ShardLoader): labels that never cross a document, a corrupt record refused while reading,
and loader state refused on another shard list."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from model_contract import TFRecordCorruptError
from tests.trainer_fixtures import loader_of as _loader, merge_states, write_dataset
from trainer.data import make_labels
from trainer.model import IGNORE_INDEX

torch.set_num_threads(1)


def test_labels_mask_document_boundaries_and_padding():
    ids = np.array([[5, 6, 1, 7, 8, 1, 0, 0]])
    seg = np.array([[1, 1, 1, 2, 2, 2, 0, 0]])
    assert make_labels(ids, seg).tolist() == [[6, 1, IGNORE_INDEX, 8, 1, IGNORE_INDEX, IGNORE_INDEX,
                                               IGNORE_INDEX]]


def test_corrupt_shard_is_an_error(tmp_path):
    d = write_dataset(str(tmp_path), seq_len=32, vocab=64, n_docs=100, n_shards=1)
    path = os.path.join(d, "gen-test", "train-00000-of-00001.tfrecord")
    data = bytearray(open(path, "rb").read())
    data[40] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(TFRecordCorruptError):
        loader = _loader(d, streams=1)
        for _ in range(loader.steps_per_epoch):
            next(loader)


def test_loader_refuses_a_checkpoint_taken_on_another_shard_list(shared_dataset, tmp_path):
    """An --incremental commit adds shards: saved (shard index, offset) positions would point elsewhere."""
    state = merge_states([_loader(shared_dataset).state_dict()])
    grown = write_dataset(str(tmp_path / "grown"), seq_len=32, vocab=64, n_docs=500)
    other = _loader(grown)
    with pytest.raises(ValueError, match="shard list changed"):
        other.load_state_dict(state)
    same = _loader(shared_dataset)
    same.load_state_dict(state)  # the same dataset resumes fine
