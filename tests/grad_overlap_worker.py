"""torchrun worker for tests/e2e/test_trainer_grad_overlap.py: the same data-parallel run with each gradient
reduction mode (trainer/grad_sync.py) through the trainer's own build and `train_step`.

For every requested mode each rank saves (torch.save, one file per mode and rank): every step's loss and gradient
norm, its GradSyncTiming, the parameters after the last step, and the one-process reference of
tests/parallel_worker.py (plain AdamW on the same global batches).
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from tests.parallel_worker import CFG, GLOBAL_BATCH, OPTIM, STEPS, StepTrainer, batch, reference
from trainer.config import OptimConfig, ParallelConfig, TrainConfig

DP, MICROBATCHES = 2, 2
BUCKET_MB = 0.02  # ~5k fp32 values: the tiny model's 70k parameters in several buckets


def run_mode(mode: str, ac: str) -> dict:
    local = GLOBAL_BATCH // DP
    pcfg = ParallelConfig(dp=DP, microbatches=MICROBATCHES, microbatch_size=local // MICROBATCHES, ac=ac,
                          grad_reduce=mode, grad_bucket_mb=BUCKET_MB)
    cfg = TrainConfig(model=CFG, parallel=pcfg, optim=OptimConfig(**OPTIM, adamw="foreach"), steps=STEPS,
                      device="cpu", loss="chunked")
    rank = int(os.environ["RANK"])
    rows = slice(rank * local, (rank + 1) * local)
    batches = [{k: v[rows] for k, v in batch(s, False).items()} for s in range(STEPS)]
    t = StepTrainer(cfg, batches, None)
    t.build_model()
    t.build_schedule()
    steps = [t.train_step() for _ in range(STEPS)]
    return {"mode": mode, "reducer": type(t.grad_sync).__name__, "losses": [float(s.loss) for s in steps],
            "norms": [float(s.grad_norm) for s in steps], "timings": [s.grad_sync for s in steps],
            "params": {n: p.detach().clone() for n, p in t.module.named_parameters()}}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--modes", nargs="+", required=True, help="MODE[:AC], e.g. hooks after-backward hooks:full")
    a = p.parse_args()
    torch.set_num_threads(1)
    ref = reference(False)
    for spec in a.modes:
        mode, _, ac = spec.partition(":")
        res = run_mode(mode, ac or "none")
        res["ref"] = {"losses": ref["losses"], "norms": ref["norms"], "params": ref["params"]}
        torch.save(res, os.path.join(a.out, f"{spec.replace(':', '_')}.rank{dist.get_rank()}.pt"))
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
