"""Atomic, resumable checkpoints with torch.distributed.checkpoint (every rank writes its own part).

Layout under --checkpoint-dir:
    step_00000040/           a complete checkpoint: DCP shards (*.distcp, .metadata) + meta.json
    step_00000040.tmp/       one being written (ignored, deleted on the next save)
    latest                   the name of the newest complete checkpoint (written by os.replace)

Atomicity: all ranks write into `step_N.tmp`; after a barrier rank 0 adds meta.json (step, loader state),
fsyncs, renames the directory to `step_N` and only then replaces `latest`. A crash at any point leaves
`latest` naming the previous, complete checkpoint.

Parameter names are the unpipelined model's (`blocks.7...`), and replicated tensors are de-duplicated by
DCP, so a checkpoint loads under another data-parallel size (and another pipeline split).
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict, set_state_dict)

LATEST = "latest"


def _name(step: int) -> str:
    return f"step_{step:08d}"


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def latest_checkpoint(root: Optional[str]) -> Optional[str]:
    """Path of the newest complete checkpoint, or None."""
    if not root:
        return None
    pointer = os.path.join(root, LATEST)
    if not os.path.exists(pointer):
        return None
    with open(pointer) as f:
        name = f.read().strip()
    path = os.path.join(root, name)
    if not os.path.exists(os.path.join(path, "meta.json")):
        raise RuntimeError(f"{pointer} names {name}, which is incomplete: the checkpoint directory was altered")
    return path


def _zero(optimizer) -> bool:
    return type(optimizer).__name__ == "ZeroRedundancyOptimizer"


def save(root: str, step: int, module: torch.nn.Module, optimizer, meta: dict, env, keep: int = 2) -> str:
    final = os.path.join(root, _name(step))
    tmp = final + ".tmp"
    if env.rank == 0:
        os.makedirs(root, exist_ok=True)
        for stale in os.listdir(root):
            if stale.endswith(".tmp"):
                shutil.rmtree(os.path.join(root, stale), ignore_errors=True)
        os.makedirs(tmp)
    dist.barrier()
    if _zero(optimizer):
        state = {"model": module.state_dict()}
        optimizer.consolidate_state_dict(to=dist.get_global_rank(env.dp_group, 0))
        if env.dp_rank == 0:  # the full optimizer state of this stage: loads under any dp size
            torch.save(optimizer.state_dict(), os.path.join(tmp, f"zero_optim_pp{env.pp_rank}.pt"))
    else:
        msd, osd = get_state_dict(module, optimizer)
        state = {"model": msd, "optim": osd}
    dcp.save(state, checkpoint_id=tmp)
    dist.barrier()
    if env.rank == 0:
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump({**meta, "step": step}, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
        with open(os.path.join(root, LATEST + ".tmp"), "w") as f:
            f.write(_name(step))
            f.flush()
            os.fsync(f.fileno())
        os.replace(os.path.join(root, LATEST + ".tmp"), os.path.join(root, LATEST))
        _fsync_dir(root)
        # Keep the checkpoint just published (the one `latest` names) and the keep-1 before it; never touch a
        # higher step left by another run in this directory (sorting by name alone could delete `latest`).
        older = sorted(d for d in os.listdir(root)
                       if d.startswith("step_") and not d.endswith(".tmp") and d < _name(step))
        for old in older[:max(0, len(older) - (keep - 1))] if keep > 0 else []:
            shutil.rmtree(os.path.join(root, old), ignore_errors=True)
    dist.barrier()
    return final


def load(path: str, module: torch.nn.Module, optimizer, env) -> dict:
    """Restore module and optimizer in place; return meta.json (step, loader state, ...)."""
    if _zero(optimizer):
        state = {"model": module.state_dict()}
        dcp.load(state, checkpoint_id=path)
        module.load_state_dict(state["model"])
        full = os.path.join(path, f"zero_optim_pp{env.pp_rank}.pt")
        if not os.path.exists(full):
            raise RuntimeError(f"{path} was written without --zero; resume without --zero")
        optimizer.load_state_dict(torch.load(full, weights_only=False))
    else:
        msd, osd = get_state_dict(module, optimizer)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(strict=True))
    with open(os.path.join(path, "meta.json")) as f:
        return json.load(f)
