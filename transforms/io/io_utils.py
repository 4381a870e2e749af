"""Thin helpers over Beam's FileSystems, so every stage reads and writes local, EFS/FSx and s3:// paths alike."""
from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import json
import os
import stat
import uuid
from typing import Iterable

from apache_beam.io.filesystems import FileSystems

from model_contract.hashing import fsync_directory
from transforms.io.filesystem_options import filesystem_options


def join(base: str, *parts: str) -> str:
    return FileSystems.join(base, *parts)


def is_local(path: str) -> bool:
    return "://" not in path


def open_read(path: str):
    # Uncompressed: the compression formats are our business (we detect damage that Beam's readers hide). A local
    # path opens as Beam's LocalFileSystem would (apache_beam/io/localfilesystem.py `_path_open`: `io.open(path,
    # "rb")` when uncompressed) without FileSystems' scan of its filesystem plugins on every call: the pack stage
    # opens every unit's files once per shard (the profile is in commit a11191f's message). Same bytes, same
    # errors: tests/unit/io/test_io_utils.py.
    if is_local(path):
        return open(path, "rb")
    return FileSystems.open(path, compression_type="uncompressed")


def open_write(path: str):
    """A new file, visible under `path` only once complete.

    Local (EFS/FSx included): written under a unique hidden temp name in the same directory and renamed into
    place by `close()`; an exception inside `with` removes the temp file, so a failed or killed writer never
    leaves a half-written file under a final name, and a file that readers may hold is replaced, never
    truncated. Object stores: an object appears whole when its upload completes (written once); an empty one
    is written with a single PUT (a multipart upload with no parts is rejected).
    """
    if is_local(path):
        return _LocalAtomicWriter(path)
    return _ObjectWriter(path)


# Fault injection for tests (ENOSPC mid-run): with PILEPREP_FAULT_ENOSPC_AFTER_BYTES=N, local
# writes through open_write fail with ENOSPC once this process has written more than N bytes. Read per write,
# so Beam workers in other processes see it too; unset, it costs one dict lookup per write.
FAULT_ENOSPC_ENV = "PILEPREP_FAULT_ENOSPC_AFTER_BYTES"
_fault_written = [0]


def _fault_check(n: int) -> None:
    limit = os.environ.get(FAULT_ENOSPC_ENV)
    if limit is None:
        return
    _fault_written[0] += n
    if _fault_written[0] > int(limit):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC) + " (injected)")


class _WriteOnce:
    """`with` closes (publishes) on success and discards on an exception: no half-written file is published."""

    def close(self) -> None:
        raise NotImplementedError

    def discard(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, exc_type, _exc, _tb):
        if exc_type is None:
            self.close()
        else:
            self.discard()
        return False


# From this size a closed local file's pages are queued for writing to disk at once (start_writeback), so that
# the commit's fsync of the shards (pipeline/ops/commit.py) finds them written instead of waiting, both cores
# idle, for the shards the packers left in the page cache (docs/BENCHMARKS.md, "The last steps to the targets").
WRITEBACK_FROM_BYTES = 4 << 20


@functools.lru_cache(maxsize=1)
def _sync_file_range():
    """Linux's sync_file_range(2) through ctypes, or None where there is none."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


def start_writeback(fd: int) -> bool:
    """Queue the file's dirty pages for writing without waiting for them (SYNC_FILE_RANGE_WRITE): a hint that
    makes a later fsync cheap, never a substitute for it. False where it is not available or refused."""
    fn = _sync_file_range()
    return fn is not None and fn(fd, 0, 0, 2) == 0


class _LocalAtomicWriter(_WriteOnce):
    def __init__(self, path: str):
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self.path = path
        self._tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.part")
        fd = os.open(self._tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)  # the umask applies, as for open()
        self._f = os.fdopen(fd, "wb", buffering=1 << 20)
        self._bytes = 0

    @property
    def closed(self) -> bool:
        return self._f.closed

    def write(self, data) -> int:
        _fault_check(len(data))
        self._bytes += len(data)
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        if self._f.closed:
            return
        try:
            if self._bytes >= WRITEBACK_FROM_BYTES:
                self._f.flush()
                start_writeback(self._f.fileno())
            self._f.close()
            os.replace(self._tmp, self.path)
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            self._f.close()
        with contextlib.suppress(OSError):
            os.unlink(self._tmp)


class _ObjectWriter(_WriteOnce):
    """Beam's object-store writer, opened at the first non-empty write; nothing written = one empty PUT."""

    def __init__(self, path: str):
        self.path = path
        self._stream = None
        self.closed = False

    def write(self, data) -> int:
        if len(data) and self._stream is None:
            self._stream = FileSystems.create(self.path, compression_type="uncompressed")
        return self._stream.write(data) if len(data) else 0

    def flush(self) -> None:
        if self._stream is not None:
            self._stream.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._stream is not None:
            self._stream.close()
        elif self.path.startswith("s3://"):
            bucket, _, key = self.path.split("://", 1)[1].partition("/")
            s3_client(filesystem_options())[1].put_object(Bucket=bucket, Key=key, Body=b"")
        else:
            with FileSystems.create(self.path, compression_type="uncompressed"):
                pass

    def discard(self) -> None:
        self.closed = True  # an unfinished multipart upload is never completed: no object appears


def s3_client(options):
    """(session, boto3 S3 client) built from Beam's s3_* options the way Beam's own client builds it."""
    import boto3  # noqa: PLC0415 - only object-store runs need it

    o = options or {}
    session = boto3.session.Session(
        aws_access_key_id=o.get("s3_access_key_id"), aws_secret_access_key=o.get("s3_secret_access_key"),
        aws_session_token=o.get("s3_session_token"), region_name=o.get("s3_region_name"))
    kwargs = {"endpoint_url": o.get("s3_endpoint_url"), "use_ssl": not o.get("s3_disable_ssl", False)}
    if o.get("s3_verify") is not None:
        kwargs["verify"] = o["s3_verify"]
    if o.get("s3_api_version"):
        kwargs["api_version"] = o["s3_api_version"]
    return session, session.client("s3", **kwargs)


def write_bytes(path: str, data: bytes) -> None:
    with open_write(path) as f:
        f.write(data)


def publish_bytes(path: str, data: bytes) -> None:
    """Make `path` hold exactly `data` in one visible step: an atomic replace on local paths (EFS/FSx too),
    a single PUT on object stores (an object appears whole or not at all). For commit points (manifests) and
    single-file outputs."""
    if is_local(path):
        replace_atomically(path, data)
    else:
        write_bytes(path, data)


def replace_atomically(path: str, data: bytes) -> None:
    """Local files only: write a temp file, fsync it, rename it over `path`, fsync the directory. A reader
    sees the old file or the new one, never a part (EFS/FSx included: rename within a directory is atomic)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # A unique temp name (never a fixed `<name>.tmp` that a user's file could hold, or another writer share),
    # created with the mode a plain open() gives under the umask: mkstemp's 0600 would leave the manifest
    # unreadable to a trainer running as another user on shared FSx/EFS while its shards are 0644.
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(directory)


def fsync_files(paths) -> None:
    """Local files only: flush the data of already-written files (and their directories) to stable storage.
    Beam's FileSystems streams cannot fsync; the commit calls this before the manifest that references them."""
    directories = set()
    for path in paths:
        if not is_local(path):
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        directories.add(os.path.dirname(os.path.abspath(path)))
    for directory in sorted(directories):
        fsync_directory(directory)


def read_bytes(path: str) -> bytes:
    with open_read(path) as f:
        return f.read()


def write_jsonl(path: str, rows: Iterable[dict]) -> int:
    n = 0
    with open_write(path) as f:
        for row in rows:
            f.write((json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"))
            n += 1
    return n


def exists(path: str) -> bool:
    return FileSystems.exists(path)


def delete_tree(path: str) -> None:
    """Delete a directory (local) or every object under a prefix (object stores); missing is fine, any other
    failure raises (OSError), so no caller reports as removed what is still there.

    Local: a symbolic link (or a file) at `path` is removed itself, never what it points at; inside a directory
    `shutil.rmtree` unlinks links without following them. (`rmtree(ignore_errors=True)` on a link to a directory
    failed silently and left the link, and a run then wrote its shards through it, outside its output.)"""
    if is_local(path):
        remove_local(path)
        return
    prefix = path.rstrip("/") + "/"
    matches = FileSystems.match([prefix + "**"])[0].metadata_list
    if matches:
        FileSystems.delete([m.path for m in matches])


def remove_local(path: str) -> bool:
    """Remove the local entry `path`: a directory with everything under it, or a file or link itself (a link is
    never followed). False when nothing was there; OSError for anything that could not be removed."""
    import shutil  # noqa: PLC0415

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True

    def gone_is_fine(_fn, _path, exc_info):  # removed meanwhile by someone else: the goal holds
        if not isinstance(exc_info[1], FileNotFoundError):
            raise exc_info[1]

    shutil.rmtree(path, onerror=gone_is_fine)
    return True


def links_below(root: str, path: str) -> list:
    """The symbolic links among `path` and its ancestors up to (not including) `root`, for local paths (else []):
    a command writes below its own output only through directories it created, never through a link that would
    send its writes (and its removals) elsewhere."""
    if not is_local(path) or not is_local(root):
        return []
    root_abs, current = os.path.abspath(root), os.path.abspath(path)
    if os.path.commonpath([root_abs, current]) != root_abs:
        return []
    found = []
    while current != root_abs:
        if os.path.islink(current):
            found.append(current)
        current = os.path.dirname(current)
    return sorted(found)


class HashingWriter:
    """Write through to a stream while counting bytes and computing sha256 (for the manifest).

    Small writes (a framed record, ~10 KB) are gathered into 1 MiB blocks that are hashed and written at once
    (writes of DIRECT bytes or more go straight through): hashlib releases the GIL for every update over 2 KB,
    and with worker threads busy in Python each such release costs the writer a wait for the GIL (measured:
    packing two shards on two threads took more CPU than one after the other). Use it as a context manager
    inside the stream's own, so the last block is written before the stream closes:
    `with open_write(p) as raw, HashingWriter(raw) as out:`."""

    BLOCK = 1 << 20
    DIRECT = 1 << 18  # a write this large is few enough handoffs already (a packer's block of examples, ~0.8 MB)

    def __init__(self, stream):
        self._stream = stream
        self._sha = hashlib.sha256()
        self._pending = bytearray()
        self.bytes = 0

    def write(self, data: bytes) -> None:
        self.bytes += len(data)
        if len(data) >= self.DIRECT:  # big enough on its own: no copy into the buffer
            self.flush()
            self._stream.write(data)
            self._sha.update(data)
            return
        self._pending += data
        if len(self._pending) >= self.BLOCK:
            self.flush()

    def flush(self) -> None:
        if self._pending:
            self._stream.write(self._pending)
            self._sha.update(self._pending)
            self._pending = bytearray()

    def __enter__(self) -> "HashingWriter":
        return self

    def __exit__(self, exc_type, *_exc) -> None:
        if exc_type is None:
            self.flush()

    @property
    def sha256(self) -> str:
        self.flush()
        return self._sha.hexdigest()
