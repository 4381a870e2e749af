"""pipeline/retrieval/neighbours.py's check_rangeable: which databases `--ranges R` can cut (the whole run:
tests/e2e/test_retrieval_ranges_sidecar.py)."""
from __future__ import annotations

import pytest

from pipeline.errors import ConfigError
from pipeline.retrieval.neighbours import check_rangeable


def ivf(spec: str) -> dict:
    return {"kind": "faiss", "config": {"spec": spec, "nprobe": 4, "train_size": 100, "seed": 0}}


@pytest.mark.parametrize("spec", ["IVF8,PQ16x4np", "OPQ16,IVF8,PQ16np"])
def test_more_ranges_than_inverted_lists_is_refused(spec):
    """review33: --ranges 100 over IVF8 was accepted and wrote 100 range files (92 of them no lists, each a copy
    of the trained index): --ranges 10**6 would write a million before any query."""
    check_rangeable(ivf(spec), 8)
    check_rangeable(ivf(spec), 1)
    with pytest.raises(ConfigError, match="--ranges 9: .* 8 inverted lists"):
        check_rangeable(ivf(spec), 9)


@pytest.mark.parametrize("index", [{"kind": "bm25"}, ivf("Flat")])
def test_an_index_without_inverted_lists_is_refused(index):
    with pytest.raises(ConfigError, match="no inverted lists"):
        check_rangeable(index, 2)
