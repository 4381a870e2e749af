"""transforms/shard/near_dedup/removals.py: the packers' lookup of a shard's ids in the near-dedup stage's removal
indexes (reason per row, precedence, contamination only in the checked splits, no marker = nothing removed)."""
from __future__ import annotations

import numpy as np

from transforms.shard import doc_ids
from transforms.shard.near_dedup import removals


def _index(tmp_path, name: str, ids: list) -> str:
    path = str(tmp_path / f"{name}.ids")
    batch = np.asarray(sorted(ids), dtype=doc_ids.ID_DTYPE)
    doc_ids.write_index(path, [batch], batch.size)
    return path


def test_no_marker_means_the_run_removes_nothing(tmp_path):
    assert removals.reasons_for(np.array([1, 2]), 0, str(tmp_path)) is None
    assert removals.reasons_for(np.array([1, 2]), 0, None) is None


def test_each_row_gets_its_reason_and_the_earlier_reason_wins(tmp_path):
    near = _index(tmp_path, "near", [3, 5])
    committed = _index(tmp_path, "committed", [5, 7])
    contaminated = _index(tmp_path, "contaminated", [3, 9])
    removals.write_marker(str(tmp_path), [(removals.NEAR_DUPLICATE, near),
                                          (removals.NEAR_DUPLICATE_OF_COMMITTED, committed),
                                          (removals.CONTAMINATED, contaminated)], contaminated_splits=[0])
    column = np.array([1, 3, 5, 7, 9, 11])
    assert removals.reasons_for(column, 0, str(tmp_path)) == [
        "", "near_duplicate", "near_duplicate", "near_duplicate_of_committed", "contaminated", ""]
    # val (1) was not checked against the evaluation sets: its copy of 9 stays, and 3 is still a near-copy
    assert removals.reasons_for(column, 1, str(tmp_path)) == [
        "", "near_duplicate", "near_duplicate", "near_duplicate_of_committed", "", ""]
    assert removals.reasons_for(np.array([], dtype=np.int64), 0, str(tmp_path)) == []


def test_the_marker_round_trips_sorted_and_partitions_are_by_id():
    assert [removals.partition_of(i) for i in (0, 15, 16, 33)] == [0, 15, 0, 1]
    assert removals.REASONS[0] == removals.NEAR_DUPLICATE


def test_the_marker_lists_indexes_sorted(tmp_path):
    removals.write_marker(str(tmp_path), [("b", "y"), ("a", "x")], [2, 0])
    assert removals.load(str(tmp_path)) == {"indexes": [["a", "x"], ["b", "y"]], "contaminated_splits": [0, 2]}
