"""A step's gradients between the backward and the optimizer: averaged over the data-parallel group (and when
that communication starts), the tied embedding/head gradient summed over the pipeline, the global norm clipped.

Modes (`--grad-reduce`, resolved by trainer/config.py `resolve_grad_reduce`):
- ``ddp``: plain data parallelism (pp = tp = 1): DistributedDataParallel, `no_sync` for the earlier micro-batches;
  its reducer starts each bucket's all-reduce during the last micro-batch's backward. A timing comm hook records
  when each bucket is launched.
- ``hooks``: the stage is not DDP-wrapped (pp > 1, where torch's DDP reducer cannot take several micro-batches in
  flight, and tp > 1, where DDP does not take DTensor parameters; also selectable for plain DP). A
  post-accumulate-grad hook on every parameter counts its accumulations; when a parameter has received its last
  micro-batch's gradient it is copied into its flat bucket, and a bucket whose parameters are all final starts its
  all-reduce asynchronously — while the backward of the rest of the model still runs. Buckets are launched in
  index order so that every rank issues the same collectives in the same order (as DDP's reducer does).
  `finish` waits for them before clipping and the optimizer step.
- ``after-backward``: one bucketed all-reduce after the whole backward (`allreduce_grads` below):
  no overlap; the reference the overlapped modes are tested against.
- ``fsdp``: FSDP2 reduce-scatters each block's gradients in its own post-backward on the last micro-batch
  (`set_requires_gradient_sync`, trainer/train.py); nothing to do here.

Every mode reports a `GradSyncTiming` per step: how many buckets started before the backward returned, how long
before its end the first one started, and how long the step then still waited for gradients (host clock; on CUDA
these are enqueue times, the device work itself is counted by the metrics' interval wall).
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from trainer.mesh import ParallelEnv
from trainer.model import GPTStage


@dataclass(frozen=True)
class GradSyncTiming:
    """One step's gradient communication, on this rank's host clock."""
    mode: str
    buckets: int  # all-reduces started this step
    in_backward: int  # of them, started before the backward returned
    lead_s: Optional[float]  # backward end - first launch: > 0 when communication started inside the backward
    exposed_s: float  # seconds the step waited for gradients after the backward (not hidden behind compute)


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (tensor-parallel or FSDP parameters), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def plan_buckets(sizes: list, bucket_bytes: int) -> list:
    """[[indices]] per bucket over `sizes` = [(numel, dtype)]: parameters in reverse order (the order backward
    produces their gradients), one dtype per bucket, a bucket closed once it holds >= bucket_bytes (the rule of
    GradBuckets above, so both modes pack alike)."""
    out, cur, size, dtype = [], [], 0, None
    for i in reversed(range(len(sizes))):
        numel, dt = sizes[i]
        if cur and (size >= bucket_bytes or dt != dtype):
            out.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += numel * torch.empty((), dtype=dt).element_size()
        dtype = dt
    if cur:
        out.append(cur)
    return out


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
    (--grad-reduce after-backward, `AfterBackwardSync` below; `always` also for pp = 1). The buckets live on the
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



class GradSync:
    """No reduction (dp = 1, or FSDP2 which reduces on its own): begin/finish do nothing and time nothing."""
    mode = "none"

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.last: Optional[GradSyncTiming] = None

    def begin(self, microbatches: int) -> None:
        """Before the step's first forward: `microbatches` backward passes will accumulate into every gradient."""

    def finish(self, backward_end: float) -> Optional[GradSyncTiming]:
        """After the step's last backward: every gradient is averaged over dp when this returns."""
        self.last = None
        return None


class AfterBackwardSync(GradSync):
    """One bucketed all-reduce after the whole backward (no overlap)."""
    mode = "after-backward"

    def __init__(self, module: nn.Module, env, bucket_bytes: int, clock=time.perf_counter):
        super().__init__(clock)
        self.module, self.env, self.bucket_bytes = module, env, bucket_bytes

    def finish(self, backward_end: float) -> GradSyncTiming:
        t0 = self.clock()
        buckets = allreduce_grads(self.module, self.env, bucket_bytes=self.bucket_bytes, always=True)
        self.last = GradSyncTiming(self.mode, buckets, 0, backward_end - t0, self.clock() - t0)
        return self.last


class DDPTimedSync(GradSync):
    """DDP reduces on its own; a comm hook (DDP's plain all-reduce, `default_hooks.allreduce_hook`: divide by
    the group size, sum) records when each bucket is launched."""
    mode = "ddp"

    def __init__(self, ddp_module, group, clock=time.perf_counter):
        super().__init__(clock)
        self.group = group
        self.launches: list = []
        ddp_module.register_comm_hook(self, DDPTimedSync._hook)

    @staticmethod
    def _hook(state: "DDPTimedSync", bucket):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks  # noqa: PLC0415
        state.launches.append(state.clock())
        return default_hooks.allreduce_hook(state.group, bucket)

    def begin(self, microbatches: int) -> None:
        self.launches = []

    def finish(self, backward_end: float) -> GradSyncTiming:
        # DDP's reducer waits for its buckets at the end of the last backward: nothing is left to wait for here.
        first = min(self.launches) if self.launches else None
        self.last = GradSyncTiming(self.mode, len(self.launches), sum(t < backward_end for t in self.launches),
                                   None if first is None else backward_end - first, 0.0)
        return self.last


class OverlappedBucketSync(GradSync):
    """Per-bucket asynchronous all-reduce started from post-accumulate-grad hooks during the last micro-batch's
    backward (see the module docstring). Buffers are allocated once and reused every step."""
    mode = "hooks"

    def __init__(self, params: list, group, world: int, bucket_bytes: int, clock=time.perf_counter):
        super().__init__(clock)
        self.params = [p for p in params if p.requires_grad]
        self.group, self.world = group, world
        sizes = [(_local(p).numel(), p.dtype) for p in self.params]
        self.layout = plan_buckets(sizes, bucket_bytes)
        self.buffers, self.slot = [], {}
        for b, idx in enumerate(self.layout):
            offset = 0
            for i in idx:
                self.slot[i] = (b, offset, sizes[i][0])
                offset += sizes[i][0]
            self.buffers.append(torch.zeros(offset, dtype=sizes[idx[0]][1], device=_local(self.params[idx[0]]).device))
        self.armed = False
        self._hooks = [p.register_post_accumulate_grad_hook(functools.partial(self._on_grad, i))
                       for i, p in enumerate(self.params)]

    def begin(self, microbatches: int) -> None:
        self.expected = microbatches
        self.counts = [0] * len(self.params)
        self.pending = [len(idx) for idx in self.layout]
        self.handles: list = [None] * len(self.layout)
        self.launch_times: list = []
        self.next = 0
        self.late: Optional[int] = None
        self.armed = True

    def _copy_in(self, i: int) -> None:
        b, offset, n = self.slot[i]
        g = self.params[i].grad
        dst = self.buffers[b][offset:offset + n]
        if g is None:  # no gradient this step (an unused parameter): it stays None; zeros keep the sum right
            dst.zero_()
        else:
            dst.copy_(_local(g).reshape(-1))

    def _launch(self, b: int) -> None:
        buf = self.buffers[b]
        buf.div_(self.world)
        self.launch_times.append(self.clock())
        self.handles[b] = dist.all_reduce(buf, group=self.group, async_op=True)

    def _on_grad(self, i: int, _param) -> None:
        if not self.armed:  # a backward outside a training step (never during one of the trainer's)
            return
        self.counts[i] += 1
        if self.counts[i] < self.expected:
            return
        b = self.slot[i][0]
        if self.counts[i] > self.expected or self.handles[b] is not None:
            self.late = i  # accumulated after its bucket was final: refused in finish, never silently dropped
            return
        self._copy_in(i)
        self.pending[b] -= 1
        while self.next < len(self.layout) and self.pending[self.next] == 0:  # in order on every rank
            self._launch(self.next)
            self.next += 1

    def finish(self, backward_end: float) -> GradSyncTiming:
        t0 = self.clock()
        self.armed = False
        if self.late is not None:
            raise RuntimeError(f"gradient of parameter #{self.late} accumulated {self.counts[self.late]} times in a "
                               f"step of {self.expected} micro-batches: its all-reduce had already started")
        in_backward = len(self.launch_times)
        for b in range(self.next, len(self.layout)):  # buckets some parameter of which got no final gradient
            for i in self.layout[b]:
                if self.counts[i] < self.expected:
                    self._copy_in(i)
            self._launch(b)
        self.next = len(self.layout)
        for b, idx in enumerate(self.layout):
            self.handles[b].wait()
            buf = self.buffers[b]
            for i in idx:
                g = self.params[i].grad
                if g is not None:
                    _, offset, n = self.slot[i]
                    local = _local(g)
                    local.copy_(buf[offset:offset + n].view_as(local))
        self.handles = [None] * len(self.layout)
        first = self.launch_times[0] if self.launch_times else None
        self.last = GradSyncTiming(self.mode, len(self.layout), in_backward,
                                   None if first is None else backward_end - first, self.clock() - t0)
        return self.last


def build_grad_sync(mode: str, module: nn.Module, runnable: nn.Module, env, bucket_bytes: int) -> GradSync:
    """The reducer of a resolved `mode` for this rank's stage (`module` owns the parameters; `runnable` is the
    DDP wrapper in ddp mode)."""
    if env.dp == 1 or mode == "fsdp":
        return GradSync()
    if mode == "ddp":
        return DDPTimedSync(runnable, env.dp_group)
    if mode == "hooks":
        return OverlappedBucketSync(list(module.parameters()), env.dp_group, env.dp, bucket_bytes)
    return AfterBackwardSync(module, env, bucket_bytes)


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
