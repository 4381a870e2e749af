"""pipeline/retrieval/build_read.py's pure steps: a document assembled from its pieces with one deterministic
source, and ReadPieces' one output split by kind (its DoFns in a Beam build: tests/e2e/test_retrieval_pipeline.py,
on Dask tests/e2e/test_retrieval_dask.py)."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.retrieval import build_read


def test_a_document_is_its_pieces_in_offset_order_under_its_smallest_source():
    ((doc_id, source, tokens),) = build_read.assemble((7, {"pieces": [(2, [3, 4]), (0, [1, 2])],
                                                           "sources": ["arXiv", "Pile-CC"]}))
    assert doc_id == 7 and source == "Pile-CC"  # min of the two: the same pick on every run
    assert np.array_equal(tokens, [1, 2, 3, 4])


def test_a_document_without_pieces_is_dropped_and_one_without_a_source_keeps_the_unknown_one():
    assert list(build_read.assemble((7, {"pieces": [], "sources": ["arXiv"]}))) == []
    ((_, source, _),) = build_read.assemble((7, {"pieces": [(0, [1])], "sources": []}))
    assert source == build_read.UNKNOWN_SOURCE


def test_a_missing_piece_is_an_error_not_a_shorter_document():
    with pytest.raises(ValueError, match="piece at offset 3, expected 2"):
        list(build_read.assemble((7, {"pieces": [(0, [1, 2]), (3, [4])], "sources": []})))


def test_read_pieces_one_output_splits_into_pieces_and_totals_without_mixing():
    # one output of two kinds, not a tagged second output (DaskRunner mixes tagged outputs into the main one)
    toks = np.array([5, 6], np.int32)
    out = [(build_read.PIECE, (7, (0, toks))), (build_read.READ_TOTALS, {"path": "a", "pieces": 1, "tokens": 2,
                                                                          "documents": 1})]
    assert [e for x in out for e in build_read.of_kind(x, build_read.PIECE)] == [(7, (0, toks))]
    assert [e for x in out for e in build_read.of_kind(x, build_read.READ_TOTALS)] == \
        [{"path": "a", "pieces": 1, "tokens": 2, "documents": 1}]
