"""transforms/shard/pack.py: the packer's pieces tested directly (the whole packer runs in
tests/integration/shard/test_graph.py and tests/e2e)."""
from __future__ import annotations

import numpy as np

from transforms.shard.pack import append_eos


def test_append_eos_keeps_the_spill_dtype_where_the_id_fits():
    """pack_shard appends EOS in the spill's dtype (the packer casts to int64 once); an id the dtype cannot hold
    makes the document int64, never a wrapped id."""
    cache: dict = {}
    body = np.array([5, 65535, 0], dtype=np.uint16)
    out = append_eos(body, 2, cache)
    assert out.dtype == np.uint16 and out.tolist() == [5, 65535, 0, 2]
    assert append_eos(body[:0], 2, cache).tolist() == [2]
    for dtype, eos_id in ((np.uint16, 70000), (np.uint8, 256), (np.uint16, -1)):
        out = append_eos(np.array([1, 200], dtype=dtype), eos_id, {})
        assert out.dtype == np.int64 and out.tolist() == [1, 200, eos_id]
