"""Publishing a dataset: the manifest is written last and is the commit point.

Shards of a run live in their own generation directory (`gen-<fingerprint>/`) that no committed manifest
points at until the new manifest replaces the old one in a single step: `os.replace` of a fully written and
fsynced temp file on POSIX paths (EFS/FSx included), a single PUT on object stores (an S3 object appears whole
or not at all). A run killed at any moment therefore leaves the previous dataset or nothing visible.
"""
from __future__ import annotations

import os
from typing import Optional

from model_contract import MANIFEST_NAME, Manifest
from transforms import io_utils


def manifest_location(output_dir: str) -> str:
    return io_utils.join(output_dir, MANIFEST_NAME)


def read_committed(output_dir: str) -> Optional[Manifest]:
    path = manifest_location(output_dir)
    if not io_utils.exists(path):
        return None
    return Manifest.from_json(io_utils.read_bytes(path).decode("utf-8"))


def publish_manifest(output_dir: str, manifest_json: str) -> str:
    path = manifest_location(output_dir)
    data = manifest_json.encode("utf-8")
    if io_utils.is_local(path):
        os.makedirs(output_dir, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(output_dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    else:
        io_utils.write_bytes(path, data)
    return path
