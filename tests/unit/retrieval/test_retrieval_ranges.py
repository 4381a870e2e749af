"""transforms/retrieval/retrieval_ranges.py and the range files pipeline/retrieval/sharded.py writes: what bounds
a search worker's memory (issue 33 §2). A worker loads the router (the coarse quantizer, every list emptied) and
one range file at a time, so each range file must hold its own inverted lists and nothing of the others'."""
from __future__ import annotations

import os

import numpy as np

from pipeline.retrieval import sharded
from transforms.retrieval import retrieval_index, retrieval_ranges
from transforms.retrieval.retrieval_index import IndexConfig

N, DIM, NLIST, R = 4000, 16, 16, 4


def whole_index():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, DIM)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    trained = retrieval_index.serialize(retrieval_index.train_index(DIM, IndexConfig(f"IVF{NLIST},Flat", 4, N, 0), x))
    return retrieval_index.merge_parts(trained, [retrieval_index.serialize(retrieval_index.fill_part(trained, x, 0))])


def test_a_range_file_holds_only_its_own_lists_and_the_router_none(tmp_path):
    whole = whole_index()
    sharded.write_ranges(whole, None, str(tmp_path), R)
    router = retrieval_index.deserialize((tmp_path / "quantizer.faiss").read_bytes())
    assert router.ntotal == 0
    whole_bytes = len(retrieval_index.serialize(whole))
    held = []
    for r in range(R):
        path = sharded.range_file(str(tmp_path), r)
        part = retrieval_index.deserialize(open(path, "rb").read())
        lists = retrieval_ranges.ivf_of(part).invlists
        nonempty = [i for i in range(NLIST) if lists.list_size(i) > 0]
        owners = retrieval_ranges.list_range(np.asarray(nonempty), NLIST, R) if nonempty else np.array([], int)
        assert set(owners.tolist()) <= {r}, (r, nonempty)  # no list of another range
        held.append(part.ntotal)
        # the file is its lists' codes and ids plus the quantizer: a fraction of the whole index, not all of it
        assert os.path.getsize(path) < 0.5 * whole_bytes, (r, os.path.getsize(path), whole_bytes)
    assert sum(held) == N and max(held) < N
