"""model_contract/crc32c.py: every CRC-32C implementation equals google_crc32c (the shard job's), and the TFRecord
framing reads and writes without google_crc32c."""
from __future__ import annotations

import io
import random
import subprocess
import sys

import google_crc32c
import pytest

from model_contract import crc32c, tfrecord
from tests.trainer_launch import REPO

# every length up to three pure blocks (the byte loop, a partial block, several, a pairwise round padded at the
# front), and larger ones across block and power-of-two boundaries
LENGTHS = list(range(0, 3 * 256 + 9)) + [4095, 4096, 4097, 65535, 65536, 65537 * 3, 1 << 20]


def _data(n: int, seed: int) -> bytes:
    return random.Random(seed * 1_000_003 + n).randbytes(n)


@pytest.mark.parametrize("name", ["pure-numpy", "c-extension"])
def test_each_implementation_equals_google_crc32c(name):
    impls = crc32c.implementations()
    if name not in impls:
        pytest.skip("model_contract._crc32c is not built here (python setup.py build_ext --inplace)")
    value = impls[name]
    assert value(b"123456789") == 0xE3069283  # the published check value of CRC-32C
    for n in LENGTHS:
        for seed in (0, 1):
            data = _data(n, seed)
            assert value(data) == google_crc32c.value(data), (name, n, seed)
    special = [b"\x00" * 5000, b"\xff" * 5000, bytes(range(256)) * 9]
    assert [value(d) for d in special] == [google_crc32c.value(d) for d in special]
    assert value(memoryview(_data(777, 2))) == google_crc32c.value(_data(777, 2))  # any bytes-like


def test_tfrecord_framing_with_the_pure_crc(monkeypatch):
    monkeypatch.setattr(crc32c, "value", crc32c.pure_value)
    payloads = [_data(n, 3) for n in (0, 1, 300, 9000)]
    framed = b"".join(tfrecord.frame_record(p) for p in payloads)
    monkeypatch.setattr(crc32c, "value", google_crc32c.value)
    assert framed == b"".join(tfrecord.frame_record(p) for p in payloads)
    monkeypatch.setattr(crc32c, "value", crc32c.pure_value)
    assert list(tfrecord.iter_records(io.BytesIO(framed))) == payloads
    flipped = bytearray(framed)
    flipped[-10] ^= 1
    with pytest.raises(tfrecord.TFRecordCorruptError, match="data checksum"):
        list(tfrecord.iter_records(io.BytesIO(bytes(flipped))))


def test_without_google_crc32c_the_contract_imports_and_says_which_crc_runs():
    code = ("import sys; sys.modules['google_crc32c'] = None\n"
            "import model_contract\n"
            "from model_contract import crc32c\n"
            "print(crc32c.IMPLEMENTATION, hex(crc32c.value(b'123456789')))")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr[-1500:]
    name, check = p.stdout.split()
    assert name in ("c-extension", "pure-numpy") and check == "0xe3069283"
