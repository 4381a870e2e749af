"""The fixed 64-bit hash near-dedup builds on (splitmix64's finaliser), and the optional C extension.

Never Python's per-process `hash()`: signatures and band keys must be the same on every machine and runner.
The C extension (`transforms/shard/_shingles.c`, built by setup.py) computes the word-shingle path bit-identical
to the numpy one; `fast` is None where it was not built (`pileprep env` says which is active).
"""
from __future__ import annotations

import numpy as np

try:  # optional C accelerator of the word-shingle path (setup.py builds it; bit-identical to the numpy path)
    from transforms.shard import _shingles as fast
except ImportError:  # pragma: no cover - exercised where no compiler was available
    fast = None

M64 = (1 << 64) - 1
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x = x * _MIX1
        x = x ^ (x >> np.uint64(27))
        x = x * _MIX2
        return x ^ (x >> np.uint64(31))
