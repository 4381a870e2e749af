"""RETRO pieces of the trainer (trainer/retro.py) on CPU: chunked cross-attention is causal at chunk
granularity, ignores empty neighbours, and trains (gradients reach the neighbour encoder)."""
from __future__ import annotations

import torch

from trainer.retro import ChunkedCrossAttention, NeighbourEncoder, neighbour_inputs

B, N, M, K, R, D, V, PAD = 2, 32, 8, 2, 16, 32, 50, 0


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, N, D, generator=g)
    toks = torch.randint(1, V, (B, N // M, K, R), generator=g)
    ids = torch.randint(0, 1 << 40, (B, N // M, K), generator=g)
    return x, toks, ids


def _run(cca, enc, emb, x, toks, ids):
    encoded = enc(toks, emb, PAD)
    return cca(x, encoded, neighbour_inputs(toks, ids, PAD))


def test_cca_output_depends_only_on_neighbours_of_completed_chunks():
    torch.manual_seed(0)
    cca, enc, emb = ChunkedCrossAttention(D, 4, M), NeighbourEncoder(D, 4, 1, R), torch.nn.Embedding(V, D)
    x, toks, ids = _inputs()
    base = _run(cca, enc, emb, x, toks, ids)
    assert base.shape == x.shape
    assert torch.all(base[:, :M - 1] == 0)  # nothing is retrieved before the first chunk is complete
    for u in range(N // M):
        changed = toks.clone()
        changed[:, u] = torch.randint(1, V, changed[:, u].shape)
        out = _run(cca, enc, emb, x, changed, ids)
        diff = (out - base).abs().sum(dim=(0, 2))
        first = u * M + M - 1
        assert torch.all(diff[:first] == 0), f"neighbours of chunk {u} leaked into earlier tokens"
        assert diff[first:min(N, first + M)].sum() > 0


def test_empty_neighbours_contribute_nothing_and_gradients_flow():
    torch.manual_seed(1)
    cca, enc, emb = ChunkedCrossAttention(D, 4, M), NeighbourEncoder(D, 4, 1, R), torch.nn.Embedding(V, D)
    x, toks, ids = _inputs(1)
    ids[:, 1] = -1  # chunk 1 has no neighbours (e.g. a padding chunk)
    out = _run(cca, enc, emb, x, toks, ids)
    assert torch.all(out[:, M + M - 1:2 * M + M - 1] == 0) and torch.isfinite(out).all()
    out.pow(2).mean().backward()
    assert enc.pos.weight.grad is not None and enc.pos.weight.grad.abs().sum() > 0
    assert cca.q.weight.grad.abs().sum() > 0
