"""Loaded tokenizers kept for the life of a worker thread, so a DoFn's setup() that runs again is cheap.

Beam's DaskRunner runs a DoFn's setup() for every partition it processes (each partition gets a freshly
unpickled DoFn), so without a cache every bundle loads the tokenizer again: the model parse, the fast
backend's build and the byte-piece mask, ~0.3-1 s per bundle for a 32k model. FnApiRunner keeps DoFn instances,
but a cache costs nothing there.

One entry per thread, not per process: a DoFn instance is only ever used by one bundle at a time, and the fast
backends (transforms/tokenize/tokenizer_backends.py) are not documented as safe to share between threads, so a
thread's encoder is never used by another thread at the same moment; pooled worker threads (Dask's, Beam's)
reuse their own. Keys are the model's sha256 plus everything else the caller's loader depends on, so a
different model or option never reads another's entry. At most MAX_PER_THREAD entries a thread (the oldest is
dropped), so a process that runs many jobs does not pile up models.
"""
from __future__ import annotations

import hashlib
import threading
from typing import Callable, Hashable, TypeVar

T = TypeVar("T")
MAX_PER_THREAD = 2

_local = threading.local()
_loads_lock = threading.Lock()
_loads = 0  # loads in this process since it started: what the tests and benchmarks read


def loads() -> int:
    return _loads


def cached(model_bytes: bytes, options: Hashable, load: Callable[[], T]) -> T:
    """load()'s value for (sha256 of model_bytes, options), loaded once per thread and then reused."""
    global _loads
    key = (hashlib.sha256(model_bytes).hexdigest(), options)
    entries = getattr(_local, "entries", None)
    if entries is None:
        entries = _local.entries = {}
    if key in entries:
        entries[key] = entries.pop(key)  # most recently used last
        return entries[key]
    value = load()
    with _loads_lock:
        _loads += 1
    entries[key] = value
    while len(entries) > MAX_PER_THREAD:
        entries.pop(next(iter(entries)))
    return value
