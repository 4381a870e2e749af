"""Keeping worker memory flat: glibc heap settings for processes that churn through large arrays.

Beam SDK workers run bundles on a thread pool. glibc raises its mmap threshold dynamically each time a large
block is freed, after which multi-megabyte token arrays come from per-thread arenas and fragment them: measured
here, a worker's RSS grew ~10 MB per tokenized chunk (280 MB at 1x input, 376 MB at 4x). Pinning the threshold
at 1 MiB keeps large arrays in mmap'd blocks that go back to the OS on free, and the RSS stays flat. Applied
at runtime with mallopt, so it works on every runner (environment variables do not reach remote workers).

With the threshold fixed, glibc also stops raising its trim threshold, so every free that leaves more than
128 KiB at the top of a heap hands it back and the next allocation faults it in again, zeroed: the 384 MB bench
run took 2.0 M page faults, ~4 of its 27 CPU-seconds in the kernel. Keeping `TOP_PAD_BYTES` (16 MiB) at each
heap's top cut that to 0.36 M faults and 27.5 -> 25.0 CPU-s (wall 15.5 -> 14.5 s), for +10 MB of peak RSS in
the largest process (docs/BENCHMARKS.md, "Page faults"). The pad is per heap, so what it keeps is a constant,
not a share of the input.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os

_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 1 << 20
TOP_PAD_BYTES = 16 << 20


@functools.lru_cache(maxsize=1)
def configure_malloc() -> bool:
    """Fix glibc's mmap threshold (disables its dynamic growth) and keep a pad at each heap's top; False where
    this is not glibc."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
            libc.mallopt(_M_TOP_PAD, TOP_PAD_BYTES))
    except (OSError, AttributeError):
        return False


def configure_child_processes() -> None:
    """Worker processes this process starts (FnApiRunner multi_processing) pin the threshold from their
    first allocation on, Beam's own start-up included, which a later mallopt cannot reach."""
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(MMAP_THRESHOLD_BYTES))
    os.environ.setdefault("MALLOC_TOP_PAD_", str(TOP_PAD_BYTES))
