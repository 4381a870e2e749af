"""transforms/io/io_utils.py: files are written once, and a failed write publishes nothing."""
from __future__ import annotations

import errno

import pytest

from transforms.io import io_utils


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
