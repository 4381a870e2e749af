"""Process groups, the DP x PP x TP device mesh, stage construction, DDP/ZeRO, and pipeline schedules.

Layout: world = dp * pp * tp, mesh dims ("dp", "pp", "tp"), rank = (dp_index * pp + pp_index) * tp + tp_index:
the tensor-parallel group is innermost (neighbouring ranks, always within a node: its all-reduces are per layer),
then the stages of one model replica (pipeline P2P stays on NVLink when pp * tp <= 8), and the DP reduction
goes over EFA. With tp = 1 the mesh is the 2-D ("dp", "pp") one.
"""
from __future__ import annotations

import datetime
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
    tp: int = 1
    tp_rank: int = 0
    tp_mesh: Optional[object] = None  # 1-D sub-mesh for parallelize_module (tp > 1)
    dp_mesh: Optional[object] = None  # 1-D sub-mesh for fully_shard

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
    tp = int(getattr(cfg, "tp", 1) or 1)
    if world != cfg.dp * cfg.pp * tp:
        raise ValueError(f"torchrun started {world} processes but --dp {cfg.dp} x --pp {cfg.pp} x --tp {tp} = "
                         f"{cfg.dp * cfg.pp * tp}: make them agree (--nproc-per-node x nodes = dp x pp x tp)")
    device = pick_device(device_kind)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        # An explicit timeout: at Pile scale the first collective can wait minutes while ranks walk shard
        # offsets (trainer/data.py prepare_shards); NCCL's default would abort the job before it.
        dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None,
                                timeout=datetime.timedelta(minutes=float(getattr(cfg, "timeout_minutes", 60))))
    from torch.distributed.device_mesh import init_device_mesh
    if tp == 1:
        mesh = init_device_mesh(device.type, (cfg.dp, cfg.pp), mesh_dim_names=("dp", "pp"))
    else:
        mesh = init_device_mesh(device.type, (cfg.dp, cfg.pp, tp), mesh_dim_names=("dp", "pp", "tp"))
    rank = dist.get_rank()
    dp_rank, rest = divmod(rank, cfg.pp * tp)
    pp_rank, tp_rank = divmod(rest, tp)
    tied = None
    if cfg.pp > 1:  # every rank must create every group, in the same order
        for r in range(cfg.dp):
            for t in range(tp):
                first = r * cfg.pp * tp + t
                g = dist.new_group([first, first + (cfg.pp - 1) * tp])
                if (r, t) == (dp_rank, tp_rank):
                    tied = g
    return ParallelEnv(rank, world, cfg.dp, cfg.pp, dp_rank, pp_rank, device, mesh,
                       mesh.get_group("dp"), mesh.get_group("pp"), tied, tp=tp, tp_rank=tp_rank,
                       tp_mesh=mesh["tp"] if tp > 1 else None, dp_mesh=mesh["dp"])


def build_stage(cfg: ModelConfig, spec: StageSpec, seed: int, device: torch.device) -> GPTStage:
    return GPTStage(cfg, spec.layers, first=spec.first, last=spec.last, seed=seed).to(device)


# ---------------------------------------------------------------------------------------------- profiling
def profile_unit_times(cfg: ModelConfig, batch: int, device: torch.device, repeats: int = 2,
                       attention: str = "auto", bf16: bool = True) -> list[float]:
    """Measured forward+backward seconds of every unit (embed, block i, head) on one micro-batch, with the
    kernels training will run: the resolved attention kernel on a packed-document mask and, on CUDA, bf16
    autocast (fp32 blocks on dense SDPA would time other kernels than the run's)."""
    import contextlib

    from trainer.attention import build_mask, resolve_impl
    torch.manual_seed(0)
    t = cfg.seq_len
    ids = torch.randint(0, cfg.vocab_size, (batch, t), device=device)
    pos = torch.arange(t, device=device).expand(batch, t)
    seg = torch.ones(batch, t, dtype=torch.long, device=device)
    seg[:, t // 2:] = 2  # two documents per row, like packed data
    x = torch.randn(batch, t, cfg.d_model, device=device, requires_grad=True)
    mask = build_mask(seg, resolve_impl(attention, device))
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if (device.type == "cuda" and bf16)
                else contextlib.nullcontext())

    def timed(fn):
        def run():
            with autocast:
                out = fn()
            out.float().sum().backward()
        run()  # warm-up
        best = float("inf")
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            run()
            if device.type == "cuda":
                torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        return best

    emb = GPTStage(cfg, [], first=True, last=False, attention=attention).to(device)
    head = GPTStage(cfg, [], first=False, last=True, attention=attention).to(device)
    times = [timed(lambda: emb(ids, pos, seg)[0])]
    for i in range(cfg.n_layers):
        blk = Block(cfg).to(device)
        times.append(timed(lambda: blk(x, mask)))
    times.append(timed(lambda: head(x, seg)))
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


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (tensor-parallel or FSDP parameters), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


class GradBuckets:
    """Flat reduction buckets for one module's gradients, allocated once and reused every step.

    Buckets follow the parameters in reverse order (the order backward produces them) and hold one dtype each;
    `reduce` packs each bucket (one copy in), starts its all-reduce asynchronously, and only then packs the
    next, so communication overlaps the remaining copies; then it waits and copies the averages back. Before
    this, every step flattened fresh buffers and reduced them one after another."""

    def __init__(self, bucket_bytes: int = 25 << 20):
        self.bucket_bytes = bucket_bytes
        self.layout: Optional[list] = None  # [(param indices, numels)] per bucket
        self.buffers: list = []
        self.key: Optional[tuple] = None

    def _plan(self, grads: list) -> None:
        self.layout, self.buffers = [], []
        cur, size, dtype = [], 0, None
        order = list(range(len(grads)))[::-1]
        for i in order + [None]:
            g = grads[i] if i is not None else None
            if cur and (g is None or size >= self.bucket_bytes or g.dtype != dtype):
                self.layout.append(cur)
                self.buffers.append(torch.empty(sum(grads[j].numel() for j in cur), dtype=dtype,
                                                device=grads[cur[0]].device))
                cur, size = [], 0
            if g is not None:
                cur.append(i)
                size += g.numel() * g.element_size()
                dtype = g.dtype
        self.key = tuple((g.shape, g.dtype, g.device) for g in grads)

    def reduce(self, grads: list, group, world: int) -> None:
        if not grads:
            return
        if self.key != tuple((g.shape, g.dtype, g.device) for g in grads):
            self._plan(grads)
        handles = []
        for idx, buf in zip(self.layout, self.buffers):
            offset = 0
            for j in idx:
                n = grads[j].numel()
                buf[offset:offset + n].copy_(grads[j].reshape(-1))
                offset += n
            buf.div_(world)
            handles.append(dist.all_reduce(buf, group=group, async_op=True))
        for idx, buf, h in zip(self.layout, self.buffers, handles):
            h.wait()
            offset = 0
            for j in idx:
                n = grads[j].numel()
                grads[j].copy_(buf[offset:offset + n].view_as(grads[j]))
                offset += n


def allreduce_grads(module: nn.Module, env: ParallelEnv, bucket_bytes: int = 25 << 20,
                    always: bool = False) -> int:
    """Average gradients over the data-parallel group in reused flat buckets, after the backward
    (--grad-reduce after-backward, trainer/grad_sync.py; `always` also for pp = 1). The buckets live on the
    module. Returns the number of buckets reduced."""
    if env.dp == 1 or (env.pp == 1 and not always):
        return 0
    buckets = getattr(module, "_grad_buckets", None)
    if buckets is None:
        buckets = GradBuckets(bucket_bytes)
        object.__setattr__(module, "_grad_buckets", buckets)  # not a submodule / parameter: plain attribute
    grads = [_local(p.grad) for p in module.parameters() if p.grad is not None]
    buckets.reduce(grads, env.dp_group, env.dp)
    return len(buckets.layout or ())


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


SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


def bubble_fraction(pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Idle share of a pipeline step in theory: (p-1)/(v*m + p-1) — GPipe and 1F1B have v = 1; interleaved 1F1B
    with v virtual stages per rank divides the bubble's time by v."""
    return (pp - 1) / (virtual_stages * microbatches + pp - 1)


def rank_stage_specs(specs: list, env: ParallelEnv, virtual_stages: int = 1) -> list:
    """The stage specs this rank runs: stage pp_rank, then pp_rank + pp, ... (the interleaved placement)."""
    return [specs[env.pp_rank + k * env.pp] for k in range(virtual_stages)]


def build_rank_stages(cfg: ModelConfig, specs: list, seed: int, device: torch.device, **stage_kwargs):
    """(owner, views): one GPTStage owning every unit of `specs` (names, optimizer, checkpoints) and the
    per-virtual-stage views the pipeline runs (just [owner] when there is one stage)."""
    from trainer.model import stage_view
    layers = [i for sp in specs for i in sp.layers]
    owner = GPTStage(cfg, layers, first=any(sp.first for sp in specs), last=any(sp.last for sp in specs),
                     seed=seed, **stage_kwargs).to(device)
    if len(specs) == 1:
        return owner, [owner]
    return owner, [stage_view(owner, sp.layers, sp.first, sp.last) for sp in specs]


def build_schedule(stage_module, env: ParallelEnv, pcfg, loss_fn):
    """A torch.distributed.pipelining stage + schedule for this rank (pp > 1). `stage_module` is one module, or
    a list of this rank's virtual stages (from build_rank_stages) for the interleaved schedule."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
    if pcfg.microbatches < env.pp:
        raise ValueError(f"--microbatches {pcfg.microbatches} < pipeline stages {env.pp}: the pipeline would "
                         f"never fill; use at least {env.pp} (more shrinks the bubble (p-1)/(m+p-1))")
    mods = list(stage_module) if isinstance(stage_module, (list, tuple)) else [stage_module]
    if pcfg.schedule not in SCHEDULES:
        raise ValueError(f"unknown --schedule {pcfg.schedule!r}; choose one of {', '.join(SCHEDULES)}")
    if pcfg.schedule == "interleaved-1f1b":
        if len(mods) < 2:
            raise ValueError("--schedule interleaved-1f1b needs --virtual-stages >= 2")
        v = len(mods)
        stages = [PipelineStage(m, env.pp_rank + k * env.pp, env.pp * v, env.device, group=env.pp_group)
                  for k, m in enumerate(mods)]
        return ScheduleInterleaved1F1B(stages, n_microbatches=pcfg.microbatches, loss_fn=loss_fn,
                                       scale_grads=False)
    if len(mods) != 1:
        raise ValueError(f"--schedule {pcfg.schedule} runs one stage per rank; virtual stages need "
                         f"interleaved-1f1b")
    stage = PipelineStage(mods[0], env.pp_rank, env.pp, env.device, group=env.pp_group)
    kinds = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
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
    # Under FSDP both ends shard the tied weight alike over dp (same shape, same dp rank): reduce the shards.
    dist.all_reduce(_local(w.grad), group=env.tied_group)


def _squared_norm(grads: list) -> torch.Tensor:
    """Sum of squares of `grads` as a plain fp32 tensor: foreach per group of like tensors (plain tensors;
    DTensors per mesh, whose full_tensor() reduces sharded dimensions and counts replicated ones once)."""
    groups: dict = {}
    for g in grads:
        key = id(g.device_mesh) if hasattr(g, "device_mesh") else None
        groups.setdefault(key, []).append(g)
    total = None
    for key, gs in groups.items():
        norm = torch.nn.utils.get_total_norm(gs, 2.0, foreach=True)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        sq = norm.float() ** 2
        total = sq if total is None else total + sq
    return total


def clip_grad_norm(module: GPTStage, max_norm: float, env: ParallelEnv, as_tensor: bool = False):
    """Global gradient norm over all pipeline stages (tied weight counted once); clip in place.

    No host sync: the norm and the clip coefficient stay on the device (foreach kernels); `as_tensor`
    returns the norm as a device tensor for the caller to read when it logs."""
    params = [p for p in module.parameters() if p.grad is not None]
    skip = module.tied_weight() if (env.pp > 1 and env.is_last_stage) else None
    counted = [p.grad.detach() for p in params if p is not skip]
    sq = _squared_norm(counted) if counted else None
    if sq is None:
        sq = torch.zeros((), device=env.device, dtype=torch.float32)
    sq = sq.to(env.device, torch.float32).reshape(())
    if env.pp > 1:
        dist.all_reduce(sq, group=env.pp_group)
    norm = sq.sqrt()
    if max_norm > 0 and params:
        coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        torch._foreach_mul_([_local(p.grad) for p in params], coef)  # local shards share the grads' storage
    return norm if as_tensor else float(norm)


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
