"""Entry point: `torchrun --nproc-per-node N -m trainer.train --data out/sample --pp 2 ...`.

Order of work: parse config (trainer/args.py `parse_args`; options derived from `trainer.config`'s dataclasses)
-> read manifest, resolve the model from the data contract, apply the batch rules (`resolve_layout`) and check
the contract — all before any process-group work, so a bad configuration is one clear error (exit 2), not a
hang -> `Trainer.build` (process groups + mesh, partition, this rank's stage, optimizer, shard checks, loader,
checkpoint restore) -> `Trainer.train` (per step: `train_step` = data, `forward_backward_step`, gradient sync,
clipping, AdamW) -> metrics -> checkpoints.

Loss normalisation: every micro-batch's loss is sum(token losses) * dp / (valid tokens in the *global*
batch), with the schedule's own scaling off. Summed over micro-batches and averaged by DDP this is exactly the
mean token loss of the global batch, so DP, PP and single-process runs compute the same gradient.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from typing import TYPE_CHECKING, Optional, Sequence

import torch
import torch.distributed as dist

from trainer import checkpoint as ckpt
from trainer.args import check_checkpoint_dir, describe_layout, parse_args, resumed_generation, retro_config
from trainer.batch import Batch, StepResult
from trainer.config import ConfigError, TrainConfig, resolve_grad_reduce
from trainer.data import ShardLoader
from trainer.dataset import check_same_generation, open_dataset, pin_generation
from trainer.grad_sync import build_grad_sync, clip_grad_norm, sync_tied_grad
from trainer.mesh import agree_on, init_distributed
from trainer.metrics import MetricsLogger
from trainer.model import IGNORE_INDEX, token_loss_sum
from trainer.optim import build_optimizer, lr_at
from trainer.parallel import parallelize
from trainer.partition import StageSpec, describe, model_units, partition_model, unit_costs
from trainer.progress import final_line, resume_command
from trainer.schedule import build_rank_stages, build_schedule, profile_unit_times, rank_stage_specs
from trainer.shard_files import DataIntegrityError, default_index_dir, prepare_shards

if TYPE_CHECKING:
    from trainer.retro import RetroSpec


class Trainer:
    """build() once, then train(); train_step() and forward_backward_step() are the per-step pieces
    (torchtitan's shape). Subclasses may extend the hooks (tests do, in tests/trainer_entry.py)."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.step = 0
        self.start_step = 0
        self.history: list = []
        self.last_checkpoint: Optional[str] = None
        self.retro: Optional[RetroSpec] = None  # RETRO stage options (build: from --retro-sidecar)

    # ------------------------------------------------------------------ build
    def build(self) -> "Trainer":
        cfg = self.cfg
        check_checkpoint_dir(cfg.checkpoint_dir)
        latest = ckpt.latest_checkpoint(cfg.checkpoint_dir) if cfg.resume else None
        meta = ckpt.read_meta(latest) if latest else None
        # read once, pinned for the run's life: a commit landing meanwhile does not move it (trainer/dataset.py)
        generation = pin_generation(cfg.data, cfg.checkpoint_dir, resumed_generation(cfg))
        self.manifest, self.manifest_file = open_dataset(cfg.data, cfg.model, generation)  # before any rendezvous
        self.retro = retro_config(cfg, self.manifest)
        self.build_model()
        check_same_generation(self.manifest.generation)
        env, pcfg, mcfg = self.env, cfg.parallel, cfg.model
        if meta and not cfg.data.streams:
            cfg.data.streams = meta["loader"]["streams"]  # chosen once, at the run's start
        self.loader = self._build_loader()
        if latest:
            meta = ckpt.load(latest, self.module, self.optimizer, env)
            self.start_step = meta["step"]
            self.loader.load_state_dict(meta["loader"])
            if env.rank == 0:
                print(f"resumed from {latest} at step {self.start_step} (was dp={meta['dp']} pp={meta['pp']}, "
                      f"now dp={env.dp} pp={env.pp}; restored in {meta['load_seconds']:.2f}s)", flush=True)
        self.step = self.start_step
        self.build_schedule()
        self.metrics = MetricsLogger(mcfg.flops_per_token(), env.world, env.device, cfg.metrics_file, env.rank == 0,
                                     total_steps=cfg.steps, model_cfg=mcfg, ac=pcfg.ac)
        if env.rank == 0:
            print(f"model {mcfg.name}: {mcfg.num_params() / 1e6:.2f}M params, {mcfg.flops_per_token() / 1e6:.1f} "
                  f"MFLOP/token; dp={env.dp} pp={env.pp} microbatches={pcfg.microbatches}x{pcfg.microbatch_size} "
                  f"schedule={pcfg.schedule} device={env.device}; {self.loader.n_streams} data streams, "
                  f"{self.loader.steps_per_epoch} steps/epoch; steps {self.start_step}->{cfg.steps}", flush=True)
        return self

    def build_model(self) -> None:
        """Process groups and mesh, this rank's stage(s) with their parallelisms, and the optimizer: the part of
        build() that reads no data (tests/parallel_worker.py drives it with its own batches)."""
        cfg = self.cfg
        env = self.env = init_distributed(cfg.parallel, cfg.device)
        pcfg, mcfg = cfg.parallel, cfg.model
        torch.manual_seed(cfg.seed)
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if (env.device.type == "cuda" and cfg.bf16)
                         else contextlib.nullcontext())
        # This rank's stage(s) -> TP / activation checkpointing / compile per block / FSDP2 or DDP; the owner
        # module keeps the parameter names (checkpoints, optimizer); `runnable` is what forward runs.
        self.module, views = build_rank_stages(mcfg, self._stage_specs(), cfg.seed, env.device,
                                               attention=cfg.attention, loss=cfg.loss, retro=self.retro)
        reduce = resolve_grad_reduce(pcfg.grad_reduce, pp=env.pp, tp=env.tp, fsdp=pcfg.fsdp)
        self.runnable = parallelize(self.module, views, env, fsdp=pcfg.fsdp, ac=pcfg.ac, compile=cfg.compile,
                                    bf16=cfg.bf16, ddp=reduce == "ddp")
        # The dp gradient average: DDP's, or hooks that start it during the last micro-batch's backward
        self.grad_sync = build_grad_sync(reduce, self.module, self.runnable[0], env,
                                         int(pcfg.grad_bucket_mb * 2**20))
        self.optimizer = build_optimizer(self.module, cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.betas,
                                         pcfg.zero, env, cfg.optim.adamw)

    def build_schedule(self) -> None:
        """The module forward runs, and the pipeline schedule when pp > 1."""
        self.model = self.runnable[0]
        self.loss_scale = 1.0
        self.schedule = (build_schedule(self.runnable, self.env, self.cfg.parallel, self.loss_fn)
                         if self.env.pp > 1 else None)

    def _stage_specs(self) -> list:
        """This rank's stage specs: one, or --virtual-stages of them (interleaved placement)."""
        cfg, env = self.cfg, self.env
        mcfg, pcfg = cfg.model, cfg.parallel
        if env.pp == 1:
            return [StageSpec(0, (), True, True, tuple(range(mcfg.n_layers)))]
        times = None
        if pcfg.partition == "profile":
            times = agree_on(profile_unit_times(mcfg, pcfg.microbatch_size, env.device, attention=cfg.attention,
                                                bf16=cfg.bf16))
        specs = partition_model(mcfg, env.pp * pcfg.virtual_stages, pcfg.partition, times)
        if env.rank == 0:
            units = model_units(mcfg)
            print(f"partition ({pcfg.partition}): " + describe(specs, units, unit_costs(units, times)), flush=True)
        return rank_stage_specs(specs, env, pcfg.virtual_stages)

    def _build_loader(self) -> ShardLoader:
        """Shard checks and offset indexes once per node (shards split over the node's ranks), then the loader."""
        cfg, env = self.cfg, self.env
        index_dir = cfg.data.index_dir or default_index_dir(cfg.checkpoint_dir)
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(env.world)))
        t0 = time.perf_counter()
        errors = prepare_shards(self.manifest, self.manifest_file, cfg.data, index_dir, local_rank, local_world)
        gathered: list = [None] * env.world
        dist.all_gather_object(gathered, errors)
        problems = sorted({e for errs in gathered for e in errs})
        if problems:
            raise DataIntegrityError(problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
        if env.rank == 0 and cfg.data.verify_data:
            print(f"verified {len(self.manifest.shards_for(cfg.data.split))} shards' sha256 in "
                  f"{time.perf_counter() - t0:.1f}s", flush=True)
        neighbours = None
        if self.retro is not None:
            from model_contract import load_manifest  # noqa: PLC0415
            from trainer.retro import AlignedSidecar  # noqa: PLC0415
            neighbours = AlignedSidecar(cfg.retro_sidecar, load_manifest(cfg.retro_sidecar), cfg.data.verify_crc)
        return ShardLoader(self.manifest, self.manifest_file, cfg.data, cfg.model.seq_len, cfg.global_batch,
                           env.dp_rank, env.dp, cfg.parallel.microbatches, index_dir=index_dir,
                           pin_memory=env.device.type == "cuda", neighbours=neighbours)

    def loss_fn(self, output, labels):
        """output: logits, or (loss="chunked") the last stage's summed token loss, shape [1]."""
        if self.cfg.loss == "chunked":
            return output.sum() * self.loss_scale
        return token_loss_sum(output, labels) * self.loss_scale

    # ------------------------------------------------------------------ one step
    def forward_backward_step(self, batch: Batch) -> torch.Tensor:
        """Forward and backward over this rank's micro-batches; returns the summed scaled loss (0 off the last
        stage), on device."""
        env, m = self.env, self.cfg.parallel.microbatches
        retro, labels_in = self.retro is not None, self.cfg.loss == "chunked"
        if self.schedule is None:
            total = torch.zeros((), device=env.device, dtype=torch.float32)
            for i, mb in enumerate(batch.chunk(m)):
                if self.cfg.parallel.fsdp:  # reduce-scatter once, after the last micro-batch's backward
                    self.model.set_requires_gradient_sync(i == m - 1)
                sync = _no_sync(self.model) if i < m - 1 else contextlib.nullcontext()
                with sync:
                    with self.autocast:
                        output = self.model(*mb.inputs(retro, labels_in))
                    loss = self.loss_fn(output, mb.labels)
                    loss.backward()
                total += loss.detach().float()
            return total
        losses: list = []
        with self.autocast:
            if env.is_first_stage:
                self.schedule.step(*batch.inputs(retro, labels_in),
                                   **({"target": batch.labels, "losses": losses} if env.is_last_stage else {}))
            elif env.is_last_stage:
                self.schedule.step(target=batch.labels, losses=losses)
            else:
                self.schedule.step()
        if env.is_last_stage:
            return torch.stack([l.detach().float() for l in losses]).sum()
        return torch.zeros((), device=env.device, dtype=torch.float32)

    def sync_grads(self) -> None:
        """Gradients averaged over dp (trainer/grad_sync.py: wait for the all-reduces the last backward started,
        or reduce now in after-backward mode; DDP and FSDP2 finished inside the backward), then the tied sum."""
        self.grad_sync.finish(backward_end=time.perf_counter())
        sync_tied_grad(self.module, self.env)

    def _bound_varlen(self, segment_ids: torch.Tensor) -> None:
        """Size the varlen kernel's sequence list by this step's documents (from the host copy: no sync)."""
        if not hasattr(self, "_varlen_stages"):
            from trainer.attention import resolve_impl  # noqa: PLC0415
            from trainer.model import GPTStage  # noqa: PLC0415
            self._varlen_stages = [m for m in self.module.modules() if isinstance(m, GPTStage)
                                   and resolve_impl(m.attention, self.env.device) == "varlen"]
        if self._varlen_stages:
            from trainer.attention import varlen_run_bound  # noqa: PLC0415
            bound = varlen_run_bound(segment_ids, self.cfg.parallel.microbatches)
            for stage in self._varlen_stages:  # the owner's VarlenBound is its views' too (model.stage_view)
                stage.varlen_bound.value = bound

    def train_step(self) -> StepResult:
        """One optimizer step: data, forward/backward, gradient sync, clip, AdamW; returns its measurements."""
        cfg, env = self.cfg, self.env
        t0 = time.perf_counter()
        host = Batch.from_loader(next(self.loader))
        wait = time.perf_counter() - t0  # data wait: the wall time of next(loader)
        t1 = time.perf_counter()
        events = None
        if env.device.type == "cuda":  # the copy is non-blocking: time it on the device, read at the flush
            events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            events[0].record()
        batch = host.to(env.device, non_blocking=True)
        if events is not None:
            events[1].record()
        h2d = time.perf_counter() - t1

        valid = (batch.labels != IGNORE_INDEX).sum().to(torch.float64)
        if env.dp > 1:
            dist.all_reduce(valid, group=env.dp_group)
        self.loss_scale = (env.dp / valid.clamp(min=1.0)).float()  # a device tensor: no host sync per step
        lr = lr_at(self.step, cfg)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.grad_sync.begin(self.cfg.parallel.microbatches)  # arms the per-bucket hooks for this step
        self._bound_varlen(host.segment_ids)
        local_loss = self.forward_backward_step(batch)
        self.sync_grads()
        grad_norm = clip_grad_norm(self.module, cfg.optim.grad_clip, env, as_tensor=True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

        loss_t = local_loss.detach().to(torch.float64).reshape(1)
        # only last stages contribute; each replica's share sums to dp x its mean, once per tensor-parallel rank
        dist.all_reduce(loss_t)
        self.step += 1
        return StepResult(loss=loss_t[0] / (env.dp * env.tp), lr=lr, grad_norm=grad_norm, wait=wait, h2d=h2d,
                          seconds=time.perf_counter() - t0, segment_ids=host.segment_ids, h2d_events=events,
                          grad_sync=self.grad_sync.last)

    def on_step_end(self, step: int) -> None:
        """Hook after a step's metrics and checkpoint (tests extend it)."""

    # ------------------------------------------------------------------ loop
    def train(self) -> list:
        """Run to cfg.steps (or a stop); returns the metrics records (every rank gets the same losses)."""
        cfg, env = self.cfg, self.env
        clock = StopClock(cfg.max_seconds, cfg.log_every)
        try:
            while self.step < cfg.steps:
                out = self.train_step()
                self.metrics.record_step(loss=out.loss, step_seconds=out.seconds, read=out.wait, decode=0.0,
                                         h2d=out.h2d, h2d_events=out.h2d_events, segment_ids=out.segment_ids,
                                         tokens=cfg.global_batch * cfg.model.seq_len, grad_sync=out.grad_sync)
                stop = clock.should_stop(self.step) or self.step == cfg.stop_at_step
                if self.step % cfg.log_every == 0 or self.step == cfg.steps or stop:
                    self.metrics.flush(self.step, out.lr, out.grad_norm,
                                       {"epoch": self.loader.state_dict()["epoch"]})
                if cfg.checkpoint_dir and ((cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0)
                                           or self.step == cfg.steps or stop):
                    self.save_checkpoint()
                self.on_step_end(self.step)
                if stop:
                    break
        finally:
            self.metrics.close()
            self.loader.close()
        dist.barrier()
        dist.destroy_process_group()
        if env.rank == 0:
            last = self.last_checkpoint or ckpt.latest_checkpoint(cfg.checkpoint_dir)
            print(final_line(self.step, cfg.steps, last, resume_command(sys.argv[1:], _main_module())), flush=True)
        return self.metrics.history

    def save_checkpoint(self) -> str:
        cfg, env = self.cfg, self.env
        meta = {"loader": self.loader.state_dict(), "dp": env.dp, "pp": env.pp,
                "model": dataclasses.asdict(cfg.model), "generation": self.manifest.generation}
        t0 = time.perf_counter()
        path = ckpt.save(cfg.checkpoint_dir, self.step, self.module, self.optimizer, meta, env, cfg.keep_checkpoints)
        dt = time.perf_counter() - t0
        self.last_checkpoint = path
        if getattr(self, "metrics", None) is not None:
            self.metrics.exclude(dt)  # not training time: the interval's rates leave it out
        if env.rank == 0:
            print(f"checkpoint {path} saved in {dt:.2f}s", flush=True)
        return path


class StopClock:
    """--max-seconds without a collective per step: every rank must stop at the same step, so rank 0's clock is
    broadcast (`agree_on`, a device sync on NCCL) only every `every` steps; 0 seconds = never."""

    def __init__(self, max_seconds: float, every: int, agree=None, clock=time.perf_counter):
        self.max_seconds, self.every = max_seconds, max(1, every)
        self.agree = agree or agree_on
        self.clock = clock
        self.t0 = clock()
        self.checks = 0

    def should_stop(self, step: int) -> bool:
        if self.max_seconds <= 0 or step % self.every:
            return False
        self.checks += 1
        return bool(self.agree(self.clock() - self.t0 > self.max_seconds))


def _main_module() -> str:
    """The module torchrun / python -m started (trainer.train, or a test entry point), for the resume line."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) or "trainer.train"


def _no_sync(model):
    """DDP's no_sync (skip the all-reduce of a micro-batch before the last); a nullcontext for every module
    that is not DDP: one process, FSDP2 (set_requires_gradient_sync), and the stages trainer/grad_sync.py
    reduces (its hooks count micro-batches and start on the last one's gradients)."""
    inner = getattr(model, "_orig_mod", model)
    return inner.no_sync() if hasattr(inner, "no_sync") else contextlib.nullcontext()


def train(cfg: TrainConfig) -> list:
    return Trainer(cfg).build().train()


def main(argv: Optional[Sequence[str]] = None, trainer_cls=Trainer) -> int:
    from model_contract import ContractMismatchError
    try:
        cfg = parse_args(argv)
        if cfg.check_only:
            print(f"ok: {describe_layout(cfg)}", flush=True)
            print(cfg.plan.format(), flush=True)
            return 0
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        trainer_cls(cfg).build().train()
    except (ContractMismatchError, ConfigError, DataIntegrityError) as e:  # no traceback, exit 2
        _error_line(f"error: {e}")
        return 2
    except FileNotFoundError as e:
        _error_line(f"error: {e.filename or e}: not found (--data is a dataset directory with manifest.json)")
        return 2
    return 0


def _error_line(text: str) -> None:
    """One write(2) per line: every rank of a run shares torchrun's stderr, and print() writes the text and its
    newline separately, so two ranks' lines could interleave into one."""
    sys.stderr.flush()
    os.write(sys.stderr.fileno(), (text.replace("\n", " ") + "\n").encode("utf-8", "replace"))


if __name__ == "__main__":
    sys.exit(main())
