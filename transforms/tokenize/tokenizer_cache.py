"""A local cache of what is derived from a tokenizer file once per machine, verified on every load.

Two things are kept (transforms/tokenize/tokenizer_backends.py, transforms/tokenize/exact_domain.py): the
tokenizer.json given to gigatoken (a `.model`'s conversion costs ~0.4 CPU-s in every process that builds the
encoder) and a fast backend's proven-equal domain (several CPU-s of probing both libraries). A wrong entry would
give wrong ids, so an entry is trusted only as far as it proves itself:
- its name is the sha256 of everything the content depends on (`key`: the source file's sha256, the library
  versions, the format of the derivation), so a stale entry is never looked up;
- it starts with a one-line JSON header holding that key again and the sha256 of the content; on load the
  header must name the same key and the content must hash to the recorded sha256, else the entry is removed and
  derived again (an altered, truncated or swapped entry);
- it is written under a temporary name in the same folder and renamed, so a reader sees a whole entry or none;
  a folder that cannot be read or written is skipped (the derivation runs, nothing is kept).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from typing import Callable, Optional

LOG = logging.getLogger("pileprep.tokenizer")
TOKENIZER_CACHE_ENV = "PILEPREP_TOKENIZER_CACHE"
_HEADER_MAX = 1 << 16


def cache_dir() -> str:
    """$PILEPREP_TOKENIZER_CACHE, else $XDG_CACHE_HOME/pileprep/tokenizers (~/.cache/...); "" when off."""
    configured = os.environ.get(TOKENIZER_CACHE_ENV)
    if configured is not None:
        return "" if configured.strip().lower() in ("", "off", "0", "no") else configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "pileprep", "tokenizers")


def key_digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()


def entry_path(folder: str, key: dict) -> str:
    return os.path.join(folder, f"{key.get('what', 'entry')}-{key_digest(key)}.bin")


def read_entry(path: str, key: dict) -> Optional[bytes]:
    """The entry's content when its header names `key` and the content matches the header's sha256; else None
    (an entry that exists but fails is removed, so the caller's rewrite replaces it)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    head, sep, content = data.partition(b"\n")
    try:
        header = json.loads(head[:_HEADER_MAX]) if sep else None
    except ValueError:
        header = None
    if not (isinstance(header, dict) and header.get("key") == key
            and header.get("content_sha256") == hashlib.sha256(content).hexdigest()):
        LOG.warning("tokenizer cache: %s is damaged or stale; deriving it again", path)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    return content


def write_entry(path: str, key: dict, content: bytes) -> None:
    """Header + content under a temporary name in the entry's folder, then renamed over the entry."""
    header = json.dumps({"key": key, "content_sha256": hashlib.sha256(content).hexdigest()}, sort_keys=True)
    folder = os.path.dirname(path)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(header.encode("utf-8") + b"\n" + content)
        os.replace(tmp, path)
    except OSError as e:
        LOG.info("tokenizer cache %s not written (%s)", folder, e)
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def cached(key: dict, derive: Callable[[], bytes]) -> bytes:
    """derive()'s bytes for `key`, from the cache when a verified entry is there, else derived and written."""
    folder = cache_dir()
    if not folder:
        return derive()
    path = entry_path(folder, key)
    content = read_entry(path, key)
    if content is None:
        content = derive()
        write_entry(path, key, content)
    return content
