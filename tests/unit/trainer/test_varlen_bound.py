"""The varlen kernel's sequence list is sized by the real documents of a batch (trainer/attention.py
varlen_run_bound), not padded to b * t + 1 entries."""
from __future__ import annotations

import torch

from trainer.attention import build_mask, varlen_boundaries, varlen_run_bound
from trainer.model import build_gpt
from trainer.config import model_config


def _runs(seg) -> list:
    starts = torch.ones_like(seg, dtype=torch.bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    return torch.nonzero(starts.reshape(-1)).reshape(-1).tolist() + [seg.numel()]


def _packed(b, t, docs_per_row, seed=0):
    g = torch.Generator().manual_seed(seed)
    seg = torch.zeros(b, t, dtype=torch.long)
    for r in range(b):
        cuts = torch.sort(torch.randperm(t - 1, generator=g)[:docs_per_row - 1] + 1).values
        seg[r] = torch.bucketize(torch.arange(t), cuts, right=True) + 1
    return seg


def test_bound_follows_the_documents_not_b_times_t():
    b, t = 8, 2048
    seg = _packed(b, t, 7)
    bound = varlen_run_bound(seg)
    runs = len(_runs(seg)) - 1
    assert runs <= bound < 2 * max(runs, 64) and bound & (bound - 1) == 0  # a power of two above the count
    assert bound == 64 and b * t == 16384  # ~56 documents: 65 entries instead of 16,385
    cu = varlen_boundaries(seg, bound).tolist()
    assert cu[:runs + 1] == _runs(seg) and set(cu[runs + 1:]) == {b * t}  # the padding: empty sequences
    # per micro-batch: the densest chunk decides; never more than a chunk can hold
    dense = torch.cat([_packed(2, 64, 2), _packed(2, 64, 60, seed=1)])
    assert varlen_run_bound(dense, microbatches=2) == 2 * 64 and varlen_run_bound(dense[:2], 1) == 64
    assert varlen_run_bound(torch.arange(16).reshape(2, 8), 1) == 16  # every token its own run: b * t
