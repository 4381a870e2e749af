"""Entry point: `torchrun --nproc-per-node N -m trainer.train --data out/sample --pp 2 ...`.

Order of work: parse config -> read manifest + contract check (before any process-group work, so a data
mismatch is one clear error, not a hang) -> process groups + mesh -> partition -> build this rank's stage ->
restore checkpoint -> train loop (data, forward/backward via DDP or a pipeline schedule, tied-grad sync,
clipping, AdamW) -> metrics -> checkpoints.

Loss normalisation: every micro-batch's loss is sum(token losses) * dp / (valid tokens in the *global*
batch), with the schedule's own scaling off. Summed over micro-batches and averaged by DDP this is exactly the
mean token loss of the global batch, so DP, PP and single-process runs compute the same gradient.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
import time
from typing import Optional, Sequence

import torch
import torch.distributed as dist

from trainer import checkpoint as ckpt
from trainer.config import DataConfig, OptimConfig, ParallelConfig, TrainConfig, model_config
from trainer.data import ShardLoader, merge_states, open_dataset
from trainer.metrics import MetricsLogger
from trainer.model import IGNORE_INDEX, token_loss_sum
from trainer.parallel import (agree_on, allreduce_grads, build_optimizer, build_schedule, build_stage, clip_grad_norm,
                              init_distributed, profile_unit_times, sync_tied_grad, wrap_data_parallel)
from trainer.partition import StageSpec, describe, model_units, partition_model, unit_costs


# ---------------------------------------------------------------------------------------------- CLI
def parse_args(argv: Optional[Sequence[str]] = None) -> TrainConfig:
    p = argparse.ArgumentParser(prog="trainer.train", description=__doc__.split("\n")[0])
    p.add_argument("--data", default="out/sample", help="dataset directory with manifest.json")
    p.add_argument("--split", default="train")
    p.add_argument("--model", default="tiny", help="tiny | 125M | 1.3B | 6.7B")
    p.add_argument("--seq-len", type=int, help="default: the model size's; 'manifest' isn't implied — "
                   "pass --seq-len-from-manifest to take it from the data")
    p.add_argument("--seq-len-from-manifest", action="store_true")
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--n-layers", type=int)
    p.add_argument("--d-model", type=int)
    p.add_argument("--n-heads", type=int)
    p.add_argument("--untied", action="store_true", help="separate input embedding and output head")
    p.add_argument("--dp", type=int, help="data-parallel size (default: world size / pp)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages")
    p.add_argument("--microbatches", type=int, default=0, help="per rank and step (default: max(pp, 1))")
    p.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b"])
    p.add_argument("--partition", default="flops", choices=["flops", "profile", "even"])
    p.add_argument("--zero", action="store_true", help="ZeRO-1: shard optimizer state over data parallel")
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--scale-lr-by-dp", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-streams", type=int, default=8)
    p.add_argument("--shuffle-buffer", type=int, default=256)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--keep-checkpoints", type=int, default=2)
    p.add_argument("--no-resume", action="store_true")
    p.add_argument("--metrics-file")
    p.add_argument("--no-bf16", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (pp = 1; GPU runs)")
    p.add_argument("--max-seconds", type=float, default=0.0)
    p.add_argument("--stop-at-step", type=int, default=0,
                   help="checkpoint and exit at this step (e.g. a job time limit); the LR schedule still "
                        "runs to --steps, so a resumed run continues exactly")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads per process (0 = default)")
    p.add_argument("--dump-grads", help="debug/tests: save each rank's gradients after the first step here")
    a = p.parse_args(argv)

    seq_len = a.seq_len
    if a.seq_len_from_manifest:
        from model_contract import load_manifest
        seq_len = load_manifest(a.data).contract.seq_len
    model = model_config(a.model, seq_len=seq_len, vocab_size=a.vocab_size, n_layers=a.n_layers,
                         d_model=a.d_model, n_heads=a.n_heads, tie_embeddings=False if a.untied else None)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    dp = a.dp or max(1, world // a.pp)
    cfg = TrainConfig(
        model=model,
        data=DataConfig(path=a.data, split=a.split, seed=a.seed, shuffle_buffer=a.shuffle_buffer,
                        streams=a.data_streams),
        parallel=ParallelConfig(dp=dp, pp=a.pp, microbatches=a.microbatches or max(a.pp, 1),
                                schedule=a.schedule, partition=a.partition, zero=a.zero),
        optim=OptimConfig(lr=a.lr, weight_decay=a.weight_decay, warmup_steps=a.warmup_steps,
                          grad_clip=a.grad_clip, scale_lr_by_dp=a.scale_lr_by_dp),
        global_batch=a.global_batch, steps=a.steps, seed=a.seed, log_every=a.log_every,
        checkpoint_dir=a.checkpoint_dir, checkpoint_every=a.checkpoint_every, keep_checkpoints=a.keep_checkpoints,
        resume=not a.no_resume, metrics_file=a.metrics_file, bf16=not a.no_bf16, max_seconds=a.max_seconds,
        device=a.device, dump_grads=a.dump_grads, compile=a.compile, stop_at_step=a.stop_at_step)
    if a.threads:
        torch.set_num_threads(a.threads)
    return cfg


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to 10% at the last step; optionally x dp (linear scaling rule)."""
    o = cfg.optim
    peak = o.lr * (cfg.parallel.dp if o.scale_lr_by_dp else 1)
    if step < o.warmup_steps:
        return peak * (step + 1) / o.warmup_steps
    frac = min(1.0, (step - o.warmup_steps) / max(1, cfg.steps - o.warmup_steps))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


# ---------------------------------------------------------------------------------------------- training
def train(cfg: TrainConfig) -> list:
    """Run training; returns the metrics records (rank 0's view; every rank gets the same losses)."""
    manifest, mfile = open_dataset(cfg.data, cfg.model)  # contract check first: fail before any rendezvous
    env = init_distributed(cfg.parallel, cfg.device)
    pcfg, mcfg = cfg.parallel, cfg.model
    torch.manual_seed(cfg.seed)
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if (env.device.type == "cuda" and cfg.bf16)
                else contextlib.nullcontext())

    local_batch = cfg.global_batch // env.dp
    loader = ShardLoader(manifest, mfile, cfg.data, mcfg.seq_len, cfg.global_batch, env.dp_rank, env.dp,
                         pcfg.microbatches)

    # ---- partition and build this rank's stage
    if env.pp > 1:
        times = None
        if pcfg.partition == "profile":
            times = agree_on(profile_unit_times(mcfg, max(1, local_batch // pcfg.microbatches), env.device))
        specs = partition_model(mcfg, env.pp, pcfg.partition, times)
        if env.rank == 0:
            units = model_units(mcfg)
            print(f"partition ({pcfg.partition}): " + describe(specs, units, unit_costs(units, times)), flush=True)
        spec = specs[env.pp_rank]
    else:
        spec = StageSpec(0, (), True, True, tuple(range(mcfg.n_layers)))
    module = build_stage(mcfg, spec, cfg.seed, env.device)
    optimizer = build_optimizer(module, cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.betas, pcfg.zero, env)

    start_step = 0
    latest = ckpt.latest_checkpoint(cfg.checkpoint_dir) if cfg.resume else None
    if latest:
        meta = ckpt.load(latest, module, optimizer, env)
        start_step = meta["step"]
        loader.load_state_dict(meta["loader"])
        if env.rank == 0:
            print(f"resumed from {latest} at step {start_step} (was dp={meta['dp']} pp={meta['pp']}, "
                  f"now dp={env.dp} pp={env.pp})", flush=True)

    model = wrap_data_parallel(module, env)
    if cfg.compile:
        if env.pp > 1:
            raise ValueError("--compile supports pp = 1 only (pipeline stages run eagerly)")
        model = torch.compile(model)  # `module` keeps the parameter names for checkpoints

    class _Scale:
        value = 1.0

    def loss_fn(logits, labels):
        return token_loss_sum(logits, labels) * _Scale.value

    schedule = build_schedule(model, env, pcfg, loss_fn) if env.pp > 1 else None
    if env.pp == 1 and pcfg.microbatches > local_batch:
        raise ValueError(f"--microbatches {pcfg.microbatches} exceeds the per-rank batch {local_batch}")

    metrics = MetricsLogger(mcfg.flops_per_token(), env.world, env.device, cfg.metrics_file, env.rank == 0)
    if env.rank == 0:
        print(f"model {mcfg.name}: {mcfg.num_params() / 1e6:.2f}M params, {mcfg.flops_per_token() / 1e6:.1f} "
              f"MFLOP/token; dp={env.dp} pp={env.pp} microbatches={pcfg.microbatches} schedule={pcfg.schedule} "
              f"device={env.device}; {loader.steps_per_epoch} steps/epoch; steps {start_step}->{cfg.steps}",
              flush=True)

    t_train = time.perf_counter()
    grad_norm, lr = 0.0, 0.0
    step = start_step
    while step < cfg.steps:
        t0 = time.perf_counter()
        r0, d0 = loader.read_seconds, loader.decode_seconds
        batch = next(loader)
        read, decode = loader.read_seconds - r0, loader.decode_seconds - d0
        t1 = time.perf_counter()
        batch = {k: v.to(env.device, non_blocking=True) for k, v in batch.items()}
        if env.device.type == "cuda":
            torch.cuda.synchronize()
        h2d = time.perf_counter() - t1

        valid = (batch["labels"] != IGNORE_INDEX).sum().to(torch.float64)
        if env.dp > 1:
            dist.all_reduce(valid, group=env.dp_group)
        _Scale.value = env.dp / max(1.0, float(valid))
        lr = lr_at(step, cfg)
        for g in optimizer.param_groups:
            g["lr"] = lr

        local_loss = 0.0
        if schedule is None:
            m = pcfg.microbatches
            chunks = {k: v.chunk(m) for k, v in batch.items()}
            for i in range(m):
                sync = contextlib.nullcontext() if (env.dp == 1 or i == m - 1) else _no_sync(model)
                with sync:
                    with autocast:
                        logits = model(chunks["input_ids"][i], chunks["positions"][i], chunks["segment_ids"][i])
                    loss = loss_fn(logits, chunks["labels"][i])
                    loss.backward()
                local_loss += float(loss.detach())
        else:
            losses: list = []
            with autocast:
                if env.is_first_stage:
                    schedule.step(batch["input_ids"], batch["positions"], batch["segment_ids"])
                elif env.is_last_stage:
                    schedule.step(target=batch["labels"], losses=losses)
                else:
                    schedule.step()
            local_loss = float(sum(l.detach().float() for l in losses)) if env.is_last_stage else 0.0

        allreduce_grads(module, env)  # pp > 1 only; DDP already did it otherwise
        sync_tied_grad(module, env)
        if cfg.dump_grads and step == start_step:
            os.makedirs(cfg.dump_grads, exist_ok=True)
            grads = {n: p.grad.detach().cpu().clone() for n, p in module.named_parameters() if p.grad is not None}
            torch.save(grads, os.path.join(cfg.dump_grads, f"grads-rank{env.rank}.pt"))
        grad_norm = clip_grad_norm(module, cfg.optim.grad_clip, env)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        loss_t = torch.tensor([local_loss], dtype=torch.float64, device=env.device)
        dist.all_reduce(loss_t)  # only last stages contribute; each replica's share sums to dp x its mean
        loss_value = float(loss_t) / env.dp
        step += 1
        if env.device.type == "cuda":
            torch.cuda.synchronize()
        metrics.record_step(loss=loss_value, step_seconds=time.perf_counter() - t0, read=read, decode=decode,
                            h2d=h2d, tokens=cfg.global_batch * mcfg.seq_len)
        stop = cfg.max_seconds > 0 and agree_on(time.perf_counter() - t_train > cfg.max_seconds)
        stop = stop or step == cfg.stop_at_step
        if step % cfg.log_every == 0 or step == cfg.steps or stop:
            metrics.flush(step, lr, grad_norm, {"epoch": loader.epoch})
        if cfg.checkpoint_dir and ((cfg.checkpoint_every and step % cfg.checkpoint_every == 0)
                                   or step == cfg.steps or stop):
            save_checkpoint(cfg, env, step, module, optimizer, loader)
        if stop:
            break

    metrics.close()
    loader.close()
    dist.barrier()
    dist.destroy_process_group()
    return metrics.history


def _no_sync(model):
    return getattr(model, "_orig_mod", model).no_sync()


def save_checkpoint(cfg: TrainConfig, env, step: int, module, optimizer, loader) -> None:
    states: list = [None] * env.world
    dist.all_gather_object(states, loader.state_dict())
    meta = {"loader": merge_states(states), "dp": env.dp, "pp": env.pp,
            "model": dataclasses.asdict(cfg.model)}
    path = ckpt.save(cfg.checkpoint_dir, step, module, optimizer, meta, env, cfg.keep_checkpoints)
    if env.rank == 0:
        print(f"checkpoint {path}", flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    from model_contract import ContractMismatchError
    try:
        train(parse_args(argv))
    except ContractMismatchError as e:  # a config error, not a crash: no traceback, every mismatch listed
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
