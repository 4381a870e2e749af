"""FSDP2 (`fully_shard`) for a pipeline stage, and activation checkpointing of its blocks.

Each block is its own FSDP unit (all-gathered just before its forward, freed after; re-gathered for backward),
the stage root holds the embeddings, final LayerNorm and head. On CUDA the parameters compute in bf16 while
gradients are reduced in fp32 (`mixed_precision`; the residual stream stays fp32, see there); the sharded
master weights and AdamW state stay fp32. On CPU everything is fp32 (gloo; the equality tests).

Composes with pipeline parallelism: `PipelineStage` recognises an FSDP module and reduce-scatters gradients only
after the last micro-batch's backward. Composes with tensor parallelism: apply TP first, then `fully_shard`
over the data-parallel sub-mesh (2-D sharding).

Activation checkpointing (`ac`):
- ``none``: keep every activation.
- ``selective``: op-level: keep the outputs of matmuls and attention, recompute the cheap element-wise ops
  (LayerNorm, GELU, residual adds) in backward; about a third of a block's activation memory for a few
  percent of compute.
- ``full``: keep only each block's input and recompute the block in backward (one extra forward, 4/3 compute).
"""
from __future__ import annotations


import torch
import torch.nn as nn

AC_MODES = ("none", "selective", "full")

# Ops whose outputs selective checkpointing keeps (the expensive ones to recompute).
_SAVE = None


def _save_list():
    global _SAVE
    if _SAVE is None:
        aten = torch.ops.aten
        ops = [aten.mm.default, aten.addmm.default, aten.bmm.default,
               aten._scaled_dot_product_efficient_attention.default,
               aten._scaled_dot_product_flash_attention.default,
               aten._scaled_dot_product_cudnn_attention.default]
        flex = getattr(torch.ops.higher_order, "flex_attention", None)
        if flex is not None:
            ops.append(flex)
        from trainer.attention import varlen_attention_op  # noqa: PLC0415
        varlen = varlen_attention_op()  # --attention varlen: recomputing it would run the kernel twice
        if varlen is not None:
            ops.append(varlen)
        _SAVE = ops
    return _SAVE


def _selective_context():
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    save = _save_list()

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply_activation_checkpointing(stage: nn.Module, mode: str) -> nn.Module:
    """Set the checkpointing mode on every block (the block's forward applies it; names do not change)."""
    if mode not in AC_MODES:
        raise ValueError(f"unknown --ac {mode!r}; choose one of {', '.join(AC_MODES)}")
    for block in stage.blocks.values():
        block.ac_mode = mode
    return stage


def checkpointed(fn, mode: str, *args):
    """Run fn(*args) under the activation-checkpointing `mode` (used by Block.forward)."""
    from torch.utils.checkpoint import checkpoint
    if mode == "none" or not torch.is_grad_enabled():
        return fn(*args)
    if mode == "full":
        return checkpoint(fn, *args, use_reentrant=False)
    return checkpoint(fn, *args, use_reentrant=False, context_fn=_selective_context)


def mixed_precision(device: torch.device, bf16: bool = True):
    """bf16 parameters for compute, fp32 gradient reduction; block inputs are *not* cast.

    Decision: the residual stream stays fp32 under FSDP2, as under DDP with autocast (and on every CPU test).
    FSDP2's default casts each block's input to bf16, which would make the residual stream bf16 under FSDP2
    only: a different model numerically, with more rounding per layer at depth. With cast_forward_inputs off,
    autocast (trainer/train.py) runs the matmuls in bf16 and LayerNorm in fp32 on the fp32 residual, and the
    first stage hands the blocks an fp32 embedding sum (trainer/model.py); trainer/plan.py counts the
    residual-stream activations as fp32 accordingly."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    if device.type == "cuda" and bf16:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                    cast_forward_inputs=False)
    return MixedPrecisionPolicy()


def apply_fsdp(stage: nn.Module, dp_mesh, device: torch.device, bf16: bool = True,
               reshard_after_forward: bool = True) -> nn.Module:
    """fully_shard every block, then the stage root; in place, returns the stage (now an FSDPModule).

    With pipeline parallelism pass reshard_after_forward=False: each block is then gathered once per step
    rather than once per micro-batch forward and again per backward (more memory, far less traffic)."""
    from torch.distributed.fsdp import fully_shard
    mp = mixed_precision(device, bf16)
    for block in stage.blocks.values():
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(stage, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return stage
