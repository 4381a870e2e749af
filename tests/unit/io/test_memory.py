"""transforms/io/memory.py: the malloc settings keep freed heap memory for the next allocation instead of handing
it back and faulting it in again (what cost the shard job ~4 CPU-s of page faults at 384 MB)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from transforms.io import memory

# Allocate, touch and free 4 MiB in 256 KiB arrays (below the pinned mmap threshold: they come from the heap),
# 40 times, and count the minor page faults of the last 39 rounds.
_CHURN = """
import json, resource, sys
import numpy as np
from transforms.io import memory
if sys.argv[1] == "configured":
    assert memory.configure_malloc()
else:  # the threshold pin alone, as before the pad
    import ctypes, ctypes.util
    ctypes.CDLL(ctypes.util.find_library("c")).mallopt(memory._M_MMAP_THRESHOLD, memory.MMAP_THRESHOLD_BYTES)
def round_():
    arrays = [np.ones(32768) for _ in range(16)]
    del arrays
round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(39):
    round_()
print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before))
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))),
                         env={k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")})
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_heap_memory_is_reused_without_new_page_faults():
    pages = 39 * 4 * (1 << 20) // 4096  # what 39 rounds fault in when every free hands the memory back
    assert _faults("pinned_only") > pages // 2  # the churn the pad removes is real here
    assert _faults("configured") < pages // 20


def test_child_processes_get_the_same_settings(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_TOP_PAD_", raising=False)
    memory.configure_child_processes()
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == str(memory.MMAP_THRESHOLD_BYTES)
    assert os.environ["MALLOC_TOP_PAD_"] == str(memory.TOP_PAD_BYTES)
