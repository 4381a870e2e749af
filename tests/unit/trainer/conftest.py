"""The synthetic datasets of the trainer's unit tests (tests/trainer_fixtures.py), shared by the test modules that
mirror trainer/dataset.py, trainer/shard_files.py, trainer/streams.py, trainer/data.py and trainer/args.py."""
from __future__ import annotations

import pytest

from tests.trainer_fixtures import write_dataset


@pytest.fixture()
def dataset(tmp_path):
    """A fresh dataset per test: the tests that edit its manifest or damage its shards."""
    return write_dataset(str(tmp_path / "ds"), seq_len=32, vocab=64, n_docs=200)


@pytest.fixture(scope="module")
def shared_dataset(tmp_path_factory):
    """One dataset per test module, read only."""
    return write_dataset(str(tmp_path_factory.mktemp("units-data")), seq_len=32, vocab=64, n_docs=400)
