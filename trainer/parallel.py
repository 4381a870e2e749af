"""Process groups, the DP x PP device mesh, stage construction, DDP/ZeRO, and pipeline schedules.

Layout: world = dp * pp, mesh dims ("dp", "pp"), rank = dp_index * pp + pp_index, so the stages of one
model replica are neighbouring ranks (on one node when pp <= 8: pipeline P2P stays on NVLink, the DP
all-reduce goes over EFA).
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from trainer.config import ModelConfig, ParallelConfig
from trainer.model import Block, GPTStage
from trainer.partition import StageSpec


@dataclass
class ParallelEnv:
    rank: int
    world: int
    dp: int
    pp: int
    dp_rank: int
    pp_rank: int
    device: torch.device
    mesh: object
    dp_group: object
    pp_group: object
    tied_group: Optional[object]  # {first stage, last stage} of this replica, when pp > 1

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_device(kind: str = "auto") -> torch.device:
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def init_distributed(cfg: ParallelConfig, device_kind: str = "auto") -> ParallelEnv:
    """Start the process group (gloo on CPU, NCCL on GPU) and the 2-D mesh. Works under torchrun or alone."""
    if "RANK" not in os.environ:  # a plain `python -m trainer.train`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(_free_port()))
    world = int(os.environ["WORLD_SIZE"])
    if world != cfg.dp * cfg.pp:
        raise ValueError(f"torchrun started {world} processes but --dp {cfg.dp} x --pp {cfg.pp} = "
                         f"{cfg.dp * cfg.pp}: make them agree (--nproc-per-node x nodes = dp x pp)")
    device = pick_device(device_kind)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device.type, (cfg.dp, cfg.pp), mesh_dim_names=("dp", "pp"))
    rank = dist.get_rank()
    dp_rank, pp_rank = divmod(rank, cfg.pp)
    tied = None
    if cfg.pp > 1:  # every rank must create every group, in the same order
        for r in range(cfg.dp):
            g = dist.new_group([r * cfg.pp, r * cfg.pp + cfg.pp - 1])
            if r == dp_rank:
                tied = g
    return ParallelEnv(rank, world, cfg.dp, cfg.pp, dp_rank, pp_rank, device, mesh,
                       mesh.get_group("dp"), mesh.get_group("pp"), tied)


def build_stage(cfg: ModelConfig, spec: StageSpec, seed: int, device: torch.device) -> GPTStage:
    return GPTStage(cfg, spec.layers, first=spec.first, last=spec.last, seed=seed).to(device)


# ---------------------------------------------------------------------------------------------- profiling
def profile_unit_times(cfg: ModelConfig, batch: int, device: torch.device, repeats: int = 2) -> list[float]:
    """Measured forward+backward seconds of every unit (embed, block i, head) on one micro-batch."""
    torch.manual_seed(0)
    t = cfg.seq_len
    ids = torch.randint(0, cfg.vocab_size, (batch, t), device=device)
    pos = torch.arange(t, device=device).expand(batch, t)
    seg = torch.ones(batch, t, dtype=torch.long, device=device)
    x = torch.randn(batch, t, cfg.d_model, device=device, requires_grad=True)
    mask = (torch.ones(t, t, dtype=torch.bool, device=device).tril())[None, None].expand(batch, 1, t, t)

    def timed(fn):
        fn()  # warm-up
        best = float("inf")
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return best

    emb = GPTStage(cfg, [], first=True, last=False).to(device)
    head = GPTStage(cfg, [], first=False, last=True).to(device)
    times = [timed(lambda: emb(ids, pos, seg)[0].sum().backward())]
    for i in range(cfg.n_layers):
        blk = Block(cfg).to(device)
        times.append(timed(lambda: blk(x, mask).sum().backward()))
    times.append(timed(lambda: head(x, seg).float().sum().backward()))
    return times


def agree_on(obj, src: int = 0):
    """Every rank takes rank src's value (measurements differ per rank; partitions must not)."""
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


# ---------------------------------------------------------------------------------------------- wrappers
def wrap_data_parallel(module: nn.Module, env: ParallelEnv) -> nn.Module:
    """DDP for pure data parallelism. With pp > 1 the stage stays unwrapped and `allreduce_grads` averages
    gradients after the schedule: DDP's reducer expects one backward per forward and, with several
    micro-batches in flight, torch 2.13 fails in bucket rebuilding (INTERNAL ASSERT in reducer.cpp)."""
    if env.dp == 1 or env.pp > 1:
        return module
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(module, process_group=env.dp_group,
               device_ids=[env.device.index] if env.device.type == "cuda" else None,
               broadcast_buffers=False)


def allreduce_grads(module: nn.Module, env: ParallelEnv, bucket_bytes: int = 25 << 20) -> None:
    """Average gradients over the data-parallel group in flat buckets (pp > 1 path)."""
    if env.dp == 1 or env.pp == 1:
        return
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    bucket, size = [], 0
    for g in grads + [None]:
        if g is not None:
            bucket.append(g)
            size += g.numel() * g.element_size()
        if bucket and (g is None or size >= bucket_bytes):
            flat = _flatten_dense_tensors(bucket)
            flat.div_(env.dp)
            dist.all_reduce(flat, group=env.dp_group)
            for dst, src in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                dst.copy_(src)
            bucket, size = [], 0


def build_optimizer(module: nn.Module, lr: float, weight_decay: float, betas, zero: bool, env: ParallelEnv):
    decay = [p for n, p in module.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in module.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if zero and env.dp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(decay, optimizer_class=torch.optim.AdamW, process_group=env.dp_group,
                                      lr=lr, betas=betas, weight_decay=weight_decay)
        opt.add_param_group({"params": no_decay, "weight_decay": 0.0})
        return opt
    return torch.optim.AdamW(groups, lr=lr, betas=betas, foreach=True)


def build_schedule(stage_module: nn.Module, env: ParallelEnv, pcfg: ParallelConfig, loss_fn):
    """A torch.distributed.pipelining stage + schedule for this rank (pp > 1)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    if pcfg.microbatches < env.pp:
        raise ValueError(f"--microbatches {pcfg.microbatches} < pipeline stages {env.pp}: the pipeline would "
                         f"never fill; use at least {env.pp} (more shrinks the bubble (p-1)/(m+p-1))")
    stage = PipelineStage(stage_module, env.pp_rank, env.pp, env.device, group=env.pp_group)
    kinds = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    if pcfg.schedule not in kinds:
        raise ValueError(f"unknown --schedule {pcfg.schedule!r}; choose gpipe or 1f1b")
    # scale_grads=False: loss_fn already divides by the global token count (see train.py).
    return kinds[pcfg.schedule](stage, n_microbatches=pcfg.microbatches, loss_fn=loss_fn, scale_grads=False)


def sync_tied_grad(module: GPTStage, env: ParallelEnv) -> None:
    """Sum the tied embedding/head gradient between the first and last stage so both copies step alike."""
    if env.tied_group is None or not (env.is_first_stage or env.is_last_stage):
        return
    w = module.tied_weight()
    if w is None:
        return
    if w.grad is None:
        w.grad = torch.zeros_like(w)
    dist.all_reduce(w.grad, group=env.tied_group)


def clip_grad_norm(module: GPTStage, max_norm: float, env: ParallelEnv) -> float:
    """Global gradient norm over all pipeline stages (tied weight counted once); clip in place."""
    params = [p for p in module.parameters() if p.grad is not None]
    skip = module.tied_weight() if (env.pp > 1 and env.is_last_stage) else None
    sq = torch.zeros((), device=env.device, dtype=torch.float32)
    for p in params:
        if p is not skip:
            sq += p.grad.detach().float().pow(2).sum()
    if env.pp > 1:
        dist.all_reduce(sq, group=env.pp_group)
    norm = float(sq.sqrt())
    if max_norm > 0 and norm > max_norm:
        coef = max_norm / (norm + 1e-6)
        for p in params:
            p.grad.mul_(coef)
    return norm
