"""CRC-32C (Castagnoli) for TFRecord framing, with no required dependency beyond numpy.

Three implementations of the same function, tried in this order:

1. `google_crc32c` (a base dependency of the shard job: hardware CRC instructions, several GB/s);
2. `model_contract._crc32c`, the optional C extension built by setup.py (table-driven slicing-by-8);
3. a pure numpy implementation (below), so that the trainer's read path runs on a machine with only torch and
   numpy, from a plain checkout with no install step (bench/gpu_check.py on the GPU machine).

All three are equality-tested against each other and the published check value (tests/unit/contract/
test_crc32c.py). `IMPLEMENTATION` names the one `value` uses; `pileprep env` and bench/gpu_check.py print it.

How the pure one is fast enough without a per-byte Python loop: the CRC register update is linear over GF(2).
Feeding byte `x` to register `r` gives `Z(r) ^ TABLE[x]`, where Z ("feed a zero byte") is linear, so with a
zero register the CRC of a B-byte block is the XOR of `T[k][byte_k]`, T[k] = Z^(B-1-k) o TABLE: one numpy
gather and XOR-reduction for every block at once. Blocks are then combined pairwise (left shifted through
the right one's length, `Z^len`, again a table lookup per register byte) in log2(blocks) vectorised rounds.
Leading zero bytes leave a zero register unchanged, which is what lets a message be padded at the front to
whole blocks; the initial register 0xFFFFFFFF is XORed into the first four message bytes (the usual identity
for a reflected CRC), after which the register starts at zero.
"""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np

_POLY = 0x82F63B78  # the Castagnoli polynomial, bit-reflected
_BLOCK = 256  # bytes per vectorised block: T is 256 x 256 uint32 (256 KiB)
_SMALL = 64  # below this, a byte loop beats the vectorised set-up


def _byte_table() -> np.ndarray:
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> np.uint32(1)) ^ np.uint32(_POLY), t >> np.uint32(1)).astype(np.uint32)
    return t


_TABLE = _byte_table()
_TABLE_LIST = _TABLE.tolist()


def _zero_byte(x: np.ndarray) -> np.ndarray:
    """Z: the register after feeding one zero byte (elementwise)."""
    return _TABLE[x & np.uint32(0xFF)] ^ (x >> np.uint32(8))


@functools.lru_cache(maxsize=None)
def _block_tables() -> np.ndarray:
    """T[k][v] = Z^(B-1-k)(TABLE[v]): the contribution of byte value v at position k of a B-byte block."""
    t = np.empty((_BLOCK, 256), dtype=np.uint32)
    t[-1] = _TABLE
    for k in range(_BLOCK - 2, -1, -1):
        t[k] = _zero_byte(t[k + 1])
    return t


@functools.lru_cache(maxsize=None)
def _shift_tables(level: int) -> np.ndarray:
    """S[i][v] = Z^(B * 2^level)(v << 8i): a register moved past B * 2^level zero bytes, per register byte."""
    if level == 0:
        s = np.empty((4, 256), dtype=np.uint32)
        for i in range(4):
            x = np.arange(256, dtype=np.uint32) << np.uint32(8 * i)
            for _ in range(_BLOCK):
                x = _zero_byte(x)
            s[i] = x
        return s
    prev = _shift_tables(level - 1)
    base = np.arange(256, dtype=np.uint32)
    return np.stack([_apply_shift(prev, _apply_shift(prev, base << np.uint32(8 * i))) for i in range(4)])


def _apply_shift(s: np.ndarray, x: np.ndarray) -> np.ndarray:
    m = np.uint32(0xFF)
    return (s[0][x & m] ^ s[1][(x >> np.uint32(8)) & m] ^ s[2][(x >> np.uint32(16)) & m]
            ^ s[3][x >> np.uint32(24)])


def _pure_small(crc: int, data) -> int:
    table = _TABLE_LIST
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc


def _pure_register(data: bytes) -> int:
    """The final register (before the output XOR) of a message of >= 4 bytes, initial register 0xFFFFFFFF."""
    n = len(data)
    pad = (-n) % _BLOCK
    blocks = n // _BLOCK + (pad > 0)
    level_blocks = 1 << max(0, (blocks - 1).bit_length())  # whole pairwise rounds: front-pad to a power of 2
    buf = np.zeros(level_blocks * _BLOCK, dtype=np.uint8)
    start = buf.size - n
    buf[start:] = np.frombuffer(data, dtype=np.uint8)
    buf[start:start + 4] ^= np.uint8(0xFF)  # the initial register, folded into the first four bytes
    rows = buf.reshape(level_blocks, _BLOCK)
    lead = (level_blocks * _BLOCK - n) // _BLOCK  # all-zero leading blocks contribute nothing: skip them
    vals = np.zeros(level_blocks, dtype=np.uint32)
    vals[lead:] = np.bitwise_xor.reduce(_block_tables()[np.arange(_BLOCK), rows[lead:]], axis=1)
    level = 0
    while vals.size > 1:
        pairs = vals.reshape(-1, 2)
        vals = _apply_shift(_shift_tables(level), pairs[:, 0]) ^ pairs[:, 1]
        level += 1
    return int(vals[0])


def pure_value(data) -> int:
    """CRC-32C of `data` (bytes-like) in numpy only."""
    data = bytes(data)
    if len(data) < _SMALL:
        return _pure_small(0xFFFFFFFF, data) ^ 0xFFFFFFFF
    return _pure_register(data) ^ 0xFFFFFFFF


def _c_value() -> Callable:
    from model_contract import _crc32c  # noqa: PLC0415 - optional C extension (setup.py)
    return _crc32c.value


def _google_value() -> Callable:
    import google_crc32c  # noqa: PLC0415 - optional here: the trainer's read path runs without it
    if getattr(google_crc32c, "implementation", "c") != "c":
        raise ImportError("google_crc32c without its C extension")  # its own pure fallback is ~100x slower
    return google_crc32c.value


def implementations() -> dict:
    """name -> value function of every implementation importable here (for tests and benchmarks)."""
    out = {}
    for name, load in (("google_crc32c", _google_value), ("c-extension", _c_value)):
        try:
            out[name] = load()
        except ImportError:
            pass
    out["pure-numpy"] = pure_value
    return out


def _select() -> tuple:
    name, fn = next(iter(implementations().items()))
    return name, fn


IMPLEMENTATION, value = _select()
