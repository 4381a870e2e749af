"""Atomic, resumable checkpoints with torch.distributed.checkpoint (every rank writes its own part).

Layout under --checkpoint-dir:
    step_00000040/           a complete checkpoint: DCP shards (*.distcp, .metadata) + meta.json
    step_00000040.tmp/       one being written (ignored, deleted on the next save)
    latest                   the name of the newest complete checkpoint (written by os.replace)

Atomicity: all ranks write into `step_N.tmp`; after a barrier rank 0 adds meta.json (step, loader state),
fsyncs, renames the directory to `step_N` and only then replaces `latest`. A crash at any point leaves
`latest` naming the previous, complete checkpoint.

Contents are keyed by parameter name, never by rank or position, so a checkpoint loads under any layout:
* `model.<name>`: the unpipelined model's names (`blocks.7...`); replicated tensors are de-duplicated by DCP.
* `optim.<name>.<key>` (`exp_avg`, `exp_avg_sq`, `step`): AdamW's state, flattened per parameter — the
  parameter groups differ per pipeline stage, so a positional optimizer state_dict (one rank's copy) cannot
  serve the others. ZeRO-1 consolidates its shards and writes the same keys, so --zero is a runtime choice.
* The tied embedding is `tok_emb.weight` in every layout: the unpipelined model's `head.weight` is the same
  tensor (not stored twice), and a last stage's synchronised copy is stored under the first stage's name, with
  its optimizer state; pp 1 -> 2 and 2 -> 1 therefore resume exactly.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
from typing import Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import time

from model_contract.hashing import fsync_directory

LATEST = "latest"
LOG = logging.getLogger("trainer.checkpoint")


def _name(step: int) -> str:
    return f"step_{step:08d}"


_STALE = re.compile(r"step_[0-9]{8}\.tmp|" + re.escape(LATEST) + r"\.tmp")  # what a crashed save of ours leaves


def _remove(path: str) -> None:
    """Remove one entry of the checkpoint directory: a link (or file) itself, never what a link points at; a
    directory with what is under it (rmtree unlinks links inside without following them). Failures raise."""
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
    else:
        shutil.rmtree(path)


def remove_stale(root: str) -> None:
    """Rank 0, before a save: what a crashed save left (`step_N.tmp`, `latest.tmp`), and only that: any other
    `*.tmp` in the directory (a user's file) was removed too, and a link among them silently survived."""
    for stale in sorted(os.listdir(root)):
        if _STALE.fullmatch(stale):
            _remove(os.path.join(root, stale))


def _fsync_dir(path: str) -> None:
    fsync_directory(path)  # the one directory fsync (model_contract/hashing.py)


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


TIED, TIED_COPY = "tok_emb.weight", "head.weight"


def _zero(optimizer) -> bool:
    return type(optimizer).__name__ == "ZeroRedundancyOptimizer"


def canonical_params(module: torch.nn.Module) -> dict:
    """{stored name: parameter} for this rank's module; the tied weight always under TIED, once."""
    out = {}
    tied = module.tied_weight() if hasattr(module, "tied_weight") else None
    for name, p in module.named_parameters():  # de-duplicates: a whole tied model yields tok_emb.weight only
        out[TIED if (tied is not None and p is tied) else name] = p
    return out


def _model_state(module) -> dict:
    """Tensors sharing the parameters' storage: DCP loads into them in place."""
    params = canonical_params(module)
    state = {f"model.{n}": p.detach() for n, p in params.items()}
    ids = {id(p) for p in params.values()}
    for name, b in module.named_buffers():
        if id(b) not in ids:
            state[f"model.{name}"] = b
    return state


def _full_optimizer_state(optimizer, params: dict, env) -> Optional[dict]:
    """{param: {key: tensor}} for every parameter of this rank's module; None on ranks that hold no copy (ZeRO:
    consolidated on the first data-parallel rank of each stage)."""
    if not _zero(optimizer):
        return {p: optimizer.state[p] for p in params.values() if p in optimizer.state}
    optimizer.consolidate_state_dict(to=0)  # a rank of the data-parallel group, not a global rank
    if env.dp_rank != 0:
        return None
    sd = optimizer.state_dict()
    order = [p for g in optimizer.param_groups for p in g["params"]]  # ZeRO's state_dict indexes in this order
    return {order[i]: st for i, st in sd["state"].items()}


def optimizer_state(optimizer, module, env) -> dict:
    params = canonical_params(module)
    full = _full_optimizer_state(optimizer, params, env)
    if full is None:
        return {}
    return {f"optim.{name}.{k}": v for name, p in params.items() for k, v in full.get(p, {}).items()
            if torch.is_tensor(v)}


def _optimizer_template(module) -> dict:
    """Where AdamW's state for every parameter of this rank loads (shapes known before the first step)."""
    out = {}
    for name, p in canonical_params(module).items():
        out[f"optim.{name}.step"] = torch.zeros((), dtype=torch.float32)
        out[f"optim.{name}.exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        out[f"optim.{name}.exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    return out


def _restore_optimizer(optimizer, module, state: dict) -> None:
    params = canonical_params(module)
    per_param = {p: {k: state[f"optim.{name}.{k}"] for k in ("step", "exp_avg", "exp_avg_sq")}
                 for name, p in params.items()}
    if not _zero(optimizer):
        on_device = optimizer.defaults.get("fused") or optimizer.defaults.get("capturable")
        for p, st in per_param.items():
            if on_device:  # fused / capturable AdamW keep `step` beside the parameter
                st["step"] = st["step"].to(p.device)
            optimizer.state[p] = st
        return
    order = [p for g in optimizer.param_groups for p in g["params"]]
    groups, i = [], 0
    for g in optimizer.param_groups:
        groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": list(range(i, i + len(g["params"])))})
        i += len(g["params"])
    optimizer.load_state_dict({"state": {j: per_param[p] for j, p in enumerate(order)}, "param_groups": groups})


def save(root: str, step: int, module: torch.nn.Module, optimizer, meta: dict, env, keep: int = 2) -> str:
    t0 = time.perf_counter()
    final = os.path.join(root, _name(step))
    tmp = final + ".tmp"
    if env.rank == 0:
        os.makedirs(root, exist_ok=True)
        remove_stale(root)
        os.makedirs(tmp)
    dist.barrier()
    state = {**_model_state(module), **optimizer_state(optimizer, module, env)}
    dcp.save(state, checkpoint_id=tmp)
    dist.barrier()
    if env.rank == 0:
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump({**meta, "step": step, "save_seconds": time.perf_counter() - t0}, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        publish(root, tmp, final, step, keep)
    dist.barrier()
    return final


def publish(root: str, tmp: str, final: str, step: int, keep: int) -> None:
    """Rank 0: rename the written checkpoint into place, then point `latest` at it, then prune.

    The order is the crash-safety argument: until the rename, `latest` names the previous complete checkpoint;
    after it, `step_N` is complete before anything names it.
    """
    if os.path.lexists(final):
        _remove(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    with open(os.path.join(root, LATEST + ".tmp"), "w") as f:
        f.write(_name(step))
        f.flush()
        os.fsync(f.fileno())
    os.replace(os.path.join(root, LATEST + ".tmp"), os.path.join(root, LATEST))
    _fsync_dir(root)
    # Keep the checkpoint just published (the one `latest` names) and the keep-1 before it; never touch a
    # higher step left by another run in this directory (sorting by name alone could delete `latest`).
    older = sorted(d for d in os.listdir(root) if re.fullmatch(r"step_[0-9]{8}", d) and d < _name(step))
    for old in older[:max(0, len(older) - (keep - 1))] if keep > 0 else []:
        try:  # the checkpoint is published: a failed prune is said, not fatal, and never silent
            _remove(os.path.join(root, old))
        except OSError as e:
            LOG.warning("checkpoint %s published, but the old %s could not be removed (%s)", final, old,
                        e.strerror or type(e).__name__)


def load(path: str, module: torch.nn.Module, optimizer, env) -> dict:
    """Restore module and optimizer in place (any layout); return meta.json (step, loader state, ...)."""
    t0 = time.perf_counter()
    model_state = _model_state(module)
    optim_state = _optimizer_template(module)
    dcp.load({**model_state, **optim_state}, checkpoint_id=path)
    _restore_optimizer(optimizer, module, optim_state)
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    meta["load_seconds"] = time.perf_counter() - t0
    return meta


def read_meta(path: str) -> dict:
    """A checkpoint's meta.json (step, loader state with its stream count, layout) without loading tensors."""
    with open(os.path.join(path, "meta.json")) as f:
        return json.load(f)
