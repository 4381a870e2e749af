"""transforms/io/decompress.py: the output per step is bounded whatever the compression ratio."""
import io

from tests.unit.io.test_read_records import MiB, zstd_bomb
from transforms.io.decompress import OUTPUT_STEP, decompressed_blocks


def test_zstd_output_per_step_is_bounded_whatever_the_ratio():
    bomb = zstd_bomb(64 * MiB)
    assert len(bomb) < 64 * 1024  # a 64 MiB line in a few KB: the ratio an attacker controls
    sizes = [len(b) for b in decompressed_blocks(io.BytesIO(bomb), "zstd")]
    assert sum(sizes) == 64 * MiB + 1
    assert max(sizes) <= OUTPUT_STEP + (128 << 10)
