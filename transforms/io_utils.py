"""Thin helpers over Beam's FileSystems, so every stage reads and writes local, EFS/FSx and s3:// paths alike."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from typing import Iterable

from apache_beam.io.filesystems import FileSystems


def join(base: str, *parts: str) -> str:
    return FileSystems.join(base, *parts)


def is_local(path: str) -> bool:
    return "://" not in path


def open_read(path: str):
    # Uncompressed: the compression formats are our business (we detect damage that Beam's readers hide).
    return FileSystems.open(path, compression_type="uncompressed")


def open_write(path: str):
    if is_local(path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return FileSystems.create(path, compression_type="uncompressed")


def write_bytes(path: str, data: bytes) -> None:
    with open_write(path) as f:
        f.write(data)


def replace_atomically(path: str, data: bytes) -> None:
    """Local files only: write a temp file, fsync it, rename it over `path`, fsync the directory. A reader
    sees the old file or the new one, never a part (EFS/FSx included: rename within a directory is atomic)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # A unique temp name (never a fixed `<name>.tmp` that a user's file could hold, or another writer share).
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
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
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


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
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


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
    """Delete a directory (local) or every object under a prefix (object stores); missing is fine."""
    if is_local(path):
        import shutil  # noqa: PLC0415

        shutil.rmtree(path, ignore_errors=True)
        return
    prefix = path.rstrip("/") + "/"
    matches = FileSystems.match([prefix + "**"])[0].metadata_list
    if matches:
        FileSystems.delete([m.path for m in matches])


class HashingWriter:
    """Write through to a stream while counting bytes and computing sha256 (for the manifest)."""

    def __init__(self, stream):
        self._stream = stream
        self._sha = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes) -> None:
        self._stream.write(data)
        self._sha.update(data)
        self.bytes += len(data)

    @property
    def sha256(self) -> str:
        return self._sha.hexdigest()
