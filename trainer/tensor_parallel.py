"""Tensor parallelism (Megatron-style, DTensor `parallelize_module`) for the GPT blocks, within a node.

Per block: `attn.qkv` column-wise (its output rows are head-major, so each rank gets whole heads with their q, k
and v), `attn.proj` row-wise (one all-reduce), `mlp.fc` column-wise, `mlp.out` row-wise (one all-reduce): two
all-reduces per block forward and two in backward, over NVLink. Embeddings, LayerNorms and the head stay
replicated: every tensor-parallel rank computes them on the same input, so their gradients agree without
communication. Parameter names do not change, so checkpoints move between tp layouts.
"""
from __future__ import annotations

import torch.nn as nn

from trainer.config import ModelConfig


def check_tp(cfg: ModelConfig, tp: int) -> None:
    if tp < 1:
        raise ValueError("--tp must be >= 1")
    if cfg.n_heads % tp or cfg.d_ff % tp:
        raise ValueError(f"--tp {tp} must divide n_heads {cfg.n_heads} and d_ff {cfg.d_ff}")
    if tp > 8:
        raise ValueError(f"--tp {tp} > 8: tensor parallelism all-reduces every layer and stays within a node")


def apply_tensor_parallel(stage: nn.Module, tp_mesh) -> nn.Module:
    """Shard every block of `stage` over the 1-D `tp_mesh` in place; returns the stage."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    plan = {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(),
            "mlp.fc": ColwiseParallel(), "mlp.out": RowwiseParallel()}
    for block in stage.blocks.values():
        parallelize_module(block, tp_mesh, plan)
    return stage
