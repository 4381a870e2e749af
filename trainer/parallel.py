"""The parallelisms applied to this rank's stage(s), in the order they compose: tensor parallel, activation
checkpointing, compile per block, then FSDP2 or DDP over dp. The mesh they run on is trainer/mesh.py's, the
pipeline schedule over the stages trainer/schedule.py's, the dp gradient average trainer/grad_sync.py's."""
from __future__ import annotations

import torch.nn as nn

from trainer.mesh import ParallelEnv
from trainer.model import GPTStage


def wrap_data_parallel(module: nn.Module, env: ParallelEnv) -> nn.Module:
    """DDP for pure data parallelism. With pp > 1 the stage stays unwrapped and `allreduce_grads`
    (trainer/grad_sync.py) averages gradients after the schedule: DDP's reducer expects one backward per forward
    and, with several micro-batches in flight, torch 2.13 fails in bucket rebuilding (INTERNAL ASSERT in
    reducer.cpp)."""
    if env.dp == 1 or env.pp > 1:
        return module
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(module, process_group=env.dp_group,
               device_ids=[env.device.index] if env.device.type == "cuda" else None,
               broadcast_buffers=False)


def parallelize(owner: GPTStage, views: list, env: ParallelEnv, *, fsdp: bool = False, ac: str = "none",
                compile: bool = False, bf16: bool = True, ddp: bool = True) -> list:
    """Apply this layout's parallelisms to the rank's stage(s), in the order they compose: tensor parallel
    (DTensor per block), activation checkpointing, compile per block, then FSDP2 over dp (or DDP for a plain
    dp-only run, unless `ddp` is off: --grad-reduce hooks / after-backward, trainer/grad_sync.py). Returns the
    modules to run: [the stage] (or DDP of it), or the interleaved views."""
    from trainer.fsdp import apply_activation_checkpointing, apply_fsdp
    from trainer.model import compile_blocks
    from trainer.tensor_parallel import apply_tensor_parallel, check_tp
    if env.tp > 1:
        check_tp(owner.cfg, env.tp)
        apply_tensor_parallel(owner, env.tp_mesh)
    apply_activation_checkpointing(owner, ac)
    if compile:
        compile_blocks(owner)
    if fsdp:
        if len(views) > 1:
            raise ValueError("--fsdp with --virtual-stages > 1 is not supported yet: use 1f1b or drop --fsdp")
        apply_fsdp(owner, env.dp_mesh, env.device, bf16, reshard_after_forward=env.pp == 1)
        return [owner]
    if len(views) > 1:
        return views
    if env.tp > 1:
        return [owner]  # DDP does not take DTensor parameters: trainer/grad_sync.py averages over dp
    return [wrap_data_parallel(owner, env)] if ddp else [owner]
