"""trainer/streams.py: the data order, through the loader that reads it: deterministic and seeded, the same
global batches for any dp, each example at most once per epoch, and an exact resume mid-epoch under another dp."""
from __future__ import annotations

import os

import pytest
import torch

from tests.trainer_fixtures import batch_ids as _ids, loader_of, merge_states
from trainer.config import DataConfig, model_config
from trainer.dataset import open_dataset
from trainer.streams import Stream, StreamState

torch.set_num_threads(1)


CFG = model_config("tiny", seq_len=32, vocab_size=64, n_layers=3, d_model=32, n_heads=2)
OPEN: list = []  # the loaders a test made, closed after it: their prefetch threads stop (tests/unit/conftest.py)


def _loader(*args, **kwargs):
    OPEN.append(loader_of(*args, **kwargs))
    return OPEN[-1]


@pytest.fixture(autouse=True)
def close_loaders():
    yield
    while OPEN:
        OPEN.pop().close()


def test_a_stream_emits_its_records_once_and_resumes_from_its_state():
    """Stream s of S takes records s, s+S, ... once each per epoch, shuffled through its buffer; a stream rebuilt
    from a copy of the state mid-way emits the same rest."""
    full = Stream(100, 8, 4, seed=3, state=StreamState(stream=5, epoch=0))
    order = [full.next() for _ in range(12)]
    assert full.next() is None and sorted(order) == list(range(5, 100, 8)) and order != sorted(order)
    first = Stream(100, 8, 4, seed=3, state=StreamState(stream=5, epoch=0))
    head = [first.next() for _ in range(6)]
    resumed = Stream(100, 8, 4, seed=3, state=StreamState.from_dict(first.state.to_dict()))
    assert head + [resumed.next() for _ in range(6)] == order


def test_data_order_is_deterministic_and_seeded(shared_dataset):
    la, lb, lc = _loader(shared_dataset), _loader(shared_dataset), _loader(shared_dataset, seed=1)
    a = [_ids(next(la)) for _ in range(5)]
    assert a == [_ids(next(lb)) for _ in range(5)]
    assert a != [_ids(next(lc)) for _ in range(5)]


def test_dp_ranks_split_the_same_global_batches(shared_dataset):
    whole = _loader(shared_dataset)
    r0, r1 = _loader(shared_dataset, 0, 2), _loader(shared_dataset, 1, 2)
    for _ in range(6):
        assert _ids(next(whole)) == _ids(next(r0)) + _ids(next(r1))


def test_epoch_sees_every_example_at_most_once_and_drops_remainder(shared_dataset):
    loader = _loader(shared_dataset)
    seen = []
    for _ in range(loader.steps_per_epoch):
        seen += _ids(next(loader))
    total = sum(s.examples for s in open_dataset(DataConfig(path=shared_dataset), CFG)[0].shards)
    assert len(seen) == loader.steps_per_epoch * 8 > total - 4 * 8
    # no record repeated: the seen examples are a sub-multiset of all records in the shards
    from collections import Counter
    from model_contract import decode_example, read_records
    manifest, mfile = open_dataset(DataConfig(path=shared_dataset), CFG)
    every = Counter(tuple(decode_example(r)["input_ids"].tolist())
                    for s in manifest.shards for r in read_records(os.path.join(shared_dataset, s.path)))
    assert not Counter(seen) - every
    next(loader)
    assert loader.epoch == 1 and loader.step_in_epoch == 1


@pytest.mark.parametrize("new_dp", [1, 2, 4])
def test_resume_mid_epoch_with_any_dp_size_sees_the_same_batches(shared_dataset, new_dp):
    ref = _loader(shared_dataset)
    expected = [_ids(next(ref)) for _ in range(12)]
    ranks = [_loader(shared_dataset, r, 2) for r in range(2)]
    for _ in range(7):
        for r in ranks:
            next(r)
    state = merge_states([r.state_dict() for r in ranks])
    resumed = [_loader(shared_dataset, r, new_dp) for r in range(new_dp)]
    for r in resumed:
        r.load_state_dict(state)
    for step in range(7, 12):
        got = sum((_ids(next(r)) for r in resumed), [])
        assert got == expected[step], step
