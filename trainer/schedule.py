"""The pipeline: the per-unit profile a --partition profile run splits by, the stage(s) this rank runs (one, or
its interleaved virtual stages), and the torch.distributed.pipelining schedule over them."""
from __future__ import annotations

import time

import torch

from trainer.config import ModelConfig
from trainer.mesh import ParallelEnv
from trainer.model import Block, GPTStage


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
