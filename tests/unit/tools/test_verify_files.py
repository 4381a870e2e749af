"""pipeline/tools/verify_files.py on its own: the band-index row checks on tiny row arrays (whole datasets checked
file by file: tests/integration/tools/test_verify.py; its digest against the shared hash:
tests/unit/contract/test_hashing.py)."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.tools import verify_files

ROW = np.dtype([("key", "<u8"), ("doc_id", "<u8"), ("split", "u1")])  # the fields the check reads
BASE = 1 << 61  # ranges = 4: the top two bits of a 63-bit key name its range; range 1 starts here


def _rows(*rows):
    return np.array([(BASE + k, d, s) for k, d, s in rows], dtype=ROW)


def test_sorted_rows_in_the_files_range_pass():
    assert verify_files._band_rows_problem(_rows((1, 5, 0), (1, 6, 2), (2, 0, 1)), 0, None, 1, 4) is None
    assert verify_files._band_rows_problem(_rows((3, 0, 0)), 10, (BASE + 2, 9), 1, 4) is None


@pytest.mark.parametrize("rows,first,previous,problem", [
    (_rows((1, 5, 0), (1, 5, 0)), 0, None, "row 1: not sorted"),
    (_rows((2, 0, 0), (1, 9, 0)), 0, None, "row 1: not sorted"),
    (_rows((1, 0, 0)), 7, (BASE + 1, 0), "row 7: not sorted by (band key, document id) after the previous row"),
    (np.array([(BASE * 2, 0, 0)], dtype=ROW), 3, None, "row 3: band key 0x4000000000000000 outside range 1"),
    (_rows((1, 0, 0), (2, 0, 9)), 0, None, "row 1: split 9 is not one of"),
])
def test_the_first_malformed_row_is_named(rows, first, previous, problem):
    assert verify_files._band_rows_problem(rows, first, previous, 1, 4).startswith(problem)
