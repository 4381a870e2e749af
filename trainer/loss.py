"""Token cross-entropy without materialising the [B, T, V] fp32 logits.

At 1.3B with micro-batch 8 x 2048 tokens and V = 50,304 the fp32 logits alone are 3.3 GB (and their gradient
as much again). `chunked_loss_sum` runs the vocabulary head and the cross-entropy over chunks of tokens under
activation checkpointing: the forward keeps only each chunk's loss, the backward recomputes one chunk's logits
at a time. Peak extra memory is one chunk's logits, whatever T. The result equals `plain_loss_sum` (the sum of
per-token losses over labels that are not IGNORE_INDEX) up to float summation order.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100


def plain_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of cross-entropy over positions whose label is not IGNORE_INDEX (fp32)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction="sum")


def _chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight)
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                     chunk_tokens: int = 4096) -> torch.Tensor:
    """sum CE(hidden @ weight.T, labels) over non-ignored labels, `chunk_tokens` tokens at a time.

    hidden: [..., d] (after the final LayerNorm), weight: [V, d], labels: [...] (same leading shape).
    """
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1)
    # The pipeline infers stage output shapes by running the last stage on *uninitialised* inputs, labels
    # included; out-of-range labels there must not raise. Real labels are range-checked by the contract check
    # before training starts, so this never hides a data error.
    y = torch.where((y >= 0) & (y < weight.shape[0]), y, torch.full_like(y, IGNORE_INDEX))
    total = h.new_zeros((), dtype=torch.float32)
    for start in range(0, h.shape[0], chunk_tokens):
        sl = slice(start, start + chunk_tokens)
        if torch.is_grad_enabled():
            total = total + checkpoint(_chunk_loss, h[sl], weight, y[sl], use_reentrant=False)
        else:
            total = total + _chunk_loss(h[sl], weight, y[sl])
    return total
