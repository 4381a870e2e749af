"""transforms/io/io_utils.py: files are written once, a failed write publishes nothing, a published file has
the mode open() gives under the umask, and its durability calls come in order."""
from __future__ import annotations

import errno
import os
import stat
import sys
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


@pytest.fixture(params=[0o022, 0o002], ids=["umask022", "umask002"])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_every_local_writer_gives_the_mode_open_gives_under_the_umask(tmp_path, umask):
    with open(tmp_path / "plain", "wb"):
        pass
    expected = _mode(tmp_path / "plain")
    assert expected == 0o666 & ~umask
    io_utils.publish_bytes(str(tmp_path / "manifest.json"), b"{}\n")  # the commit point (replace_atomically)
    io_utils.publish_bytes(str(tmp_path / "manifest.json"), b"{}\n")  # replacing an existing file, too
    io_utils.write_bytes(str(tmp_path / "shard.tfrecord"), b"x" * 10)  # open_write
    io_utils.write_jsonl(str(tmp_path / "dead.jsonl"), [{"a": 1}])
    for name in ("manifest.json", "shard.tfrecord", "dead.jsonl"):
        assert oct(_mode(tmp_path / name)) == oct(expected), name
    assert sorted(os.listdir(tmp_path)) == ["dead.jsonl", "manifest.json", "plain", "shard.tfrecord"]  # no temp left


def test_replace_atomically_fsyncs_the_file_before_the_rename_and_the_directory_after(tmp_path, monkeypatch):
    target = tmp_path / "manifest.json"
    target.write_bytes(b"old")
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        events.append(("fsync", kind))
        return real_fsync(fd)

    def replace(src, dst):
        # The temp file must already hold the whole new content when it is renamed over the target.
        events.append(("replace", open(src, "rb").read(), os.path.basename(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    io_utils.replace_atomically(str(target), b"new content")
    assert events == [("fsync", "file"), ("replace", b"new content", "manifest.json"), ("fsync", "dir")]
    assert target.read_bytes() == b"new content"


def test_a_failed_replace_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "manifest.json"
    target.write_bytes(b"old")

    def broken(_src, _dst):
        raise OSError("injected")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OSError, match="injected"):
        io_utils.replace_atomically(str(target), b"new")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["manifest.json"]


def test_a_big_file_is_queued_for_writeback_before_it_is_published_and_a_small_one_is_not(tmp_path, monkeypatch):
    """transforms/io/io_utils.py start_writeback: the commit's fsync then finds the shards already written (it
    waited ~0.5 s with both cores idle at 384 MB). A hint only: the fsync still happens at the commit."""
    seen = []

    def record(fd):
        seen.append((os.readlink(f"/proc/self/fd/{fd}"), os.fstat(fd).st_size))
        return True

    monkeypatch.setattr(io_utils, "start_writeback", record)
    big, small = tmp_path / "big.tfrecord", tmp_path / "small.json"
    with io_utils.open_write(str(big)) as f:
        f.write(b"x" * io_utils.WRITEBACK_FROM_BYTES)
    with io_utils.open_write(str(small)) as f:
        f.write(b"{}")
    assert len(seen) == 1
    name, size = seen[0]
    assert name.startswith(str(tmp_path / ".big.tfrecord.")) and name.endswith(".part")  # before the rename
    assert size == io_utils.WRITEBACK_FROM_BYTES  # every byte flushed to the file first


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range(2)")
def test_start_writeback_is_accepted_by_the_kernel(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"y" * 65536)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert io_utils.start_writeback(fd) is True
    finally:
        os.close(fd)


def test_open_read_of_a_local_path_is_beams_open(tmp_path, monkeypatch):
    """review30 (held): open_read opens a local path with io.open (a11191f); the same bytes and the same errors
    as FileSystems.open, for a relative path, a link, a missing file and a directory."""
    from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415

    (tmp_path / "f").write_bytes(b"bytes")
    os.symlink(tmp_path / "f", tmp_path / "link")
    monkeypatch.chdir(tmp_path)

    def outcome(opener, path):
        try:
            with opener(path) as f:
                return f.read()
        except OSError as e:
            return type(e), e.errno

    beam = lambda p: FileSystems.open(p, compression_type="uncompressed")  # noqa: E731
    for path in ("f", "link", str(tmp_path / "f"), str(tmp_path / "missing"), str(tmp_path)):
        assert outcome(io_utils.open_read, path) == outcome(beam, path), path
    assert outcome(io_utils.open_read, "link") == b"bytes"
    assert outcome(io_utils.open_read, "missing")[0] is FileNotFoundError
    assert outcome(io_utils.open_read, str(tmp_path))[0] is IsADirectoryError
