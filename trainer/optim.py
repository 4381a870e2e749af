"""The optimizer: AdamW parameter groups (decay x tensor kind), the fused/foreach choice, ZeRO-1, and the
learning-rate schedule."""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from trainer.config import TrainConfig
from trainer.mesh import ParallelEnv


def _tensor_kind(p: torch.Tensor):
    """What a foreach / fused AdamW kernel may batch together: plain tensors with plain tensors, DTensors with
    DTensors of the same mesh and placements (one kernel call over a mix raises "got mixed torch.Tensor and
    DTensor": tensor-parallel weights beside replicated embeddings and norms, trainer/tensor_parallel.py)."""
    if not hasattr(p, "device_mesh"):
        return None
    mesh = p.device_mesh
    return (tuple(mesh.mesh.flatten().tolist()), tuple(mesh.mesh_dim_names or ()),
            tuple(str(pl) for pl in p.placements))


def param_groups(module: nn.Module, weight_decay: float) -> list:
    """AdamW groups: (decay for matrices, none for vectors) x tensor kind, in first-appearance order (the
    same on every rank of a replica). Checkpoints key optimizer state by parameter name
    (trainer/checkpoint.py), so the grouping does not enter them."""
    groups: dict = {}
    for _, p in module.named_parameters():
        decay = p.dim() >= 2
        groups.setdefault((decay, _tensor_kind(p)), []).append(p)
    return [{"params": ps, "weight_decay": weight_decay if decay else 0.0} for (decay, _), ps in groups.items()]


ADAMW_IMPLS = ("auto", "fused", "foreach")


def adamw_impl(impl: str, device: torch.device) -> str:
    """auto: one fused kernel per group on CUDA, the foreach chain elsewhere (fused also runs on CPU)."""
    if impl not in ADAMW_IMPLS:
        raise ValueError(f"unknown --adamw {impl!r}; choose one of {', '.join(ADAMW_IMPLS)}")
    if impl == "auto":
        return "fused" if device.type == "cuda" else "foreach"
    return impl


def build_optimizer(module: nn.Module, lr: float, weight_decay: float, betas, zero: bool, env: ParallelEnv,
                    impl: str = "auto"):
    kind = adamw_impl(impl, env.device)
    flags = {"fused": True} if kind == "fused" else {"foreach": True}
    groups = param_groups(module, weight_decay)
    if zero and env.dp > 1:
        if any(_tensor_kind(p) is not None for g in groups for p in g["params"]):
            raise ValueError("--zero takes plain parameters only: with --tp or --fsdp drop --zero")
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=torch.optim.AdamW,
                                      process_group=env.dp_group, lr=lr, betas=betas,
                                      weight_decay=groups[0]["weight_decay"], **flags)
        for g in groups[1:]:
            opt.add_param_group(g)
        return opt
    return torch.optim.AdamW(groups, lr=lr, betas=betas, **flags)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to 10% at the last step. The peak LR belongs to the global batch (the
    recipe), so it does not change with the layout or on a resume with another dp."""
    o = cfg.optim
    if step < o.warmup_steps:
        return o.lr * (step + 1) / o.warmup_steps
    frac = min(1.0, (step - o.warmup_steps) / max(1, cfg.steps - o.warmup_steps))
    return o.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
