"""torchrun worker for the FSDP2 / tensor-parallel equality tests (tests/e2e/test_trainer_layouts.py).

Every rank builds the unparallelised model and computes the reference loss and gradients of one global batch
locally; then, for each requested layout (dp x pp x tp, FSDP on or off, activation checkpointing), it builds its
own stage through the trainer's modules (partition, tensor_parallel, fsdp, pipeline schedule), runs the same
global batch and compares loss, global gradient norm and every parameter's full gradient with the reference.
One JSON line per rank and layout goes to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import types

import torch
import torch.distributed as dist

from trainer.config import model_config
from trainer.fsdp import apply_activation_checkpointing, apply_fsdp
from trainer.loss import IGNORE_INDEX, plain_loss_sum
from trainer.model import build_gpt
from trainer.parallel import (allreduce_grads, build_rank_stages, build_schedule, clip_grad_norm, init_distributed,
                              rank_stage_specs, sync_tied_grad)
from trainer.partition import partition_model
from trainer.tensor_parallel import apply_tensor_parallel

CFG = model_config("tiny", seq_len=32, vocab_size=64, n_layers=3, d_model=32, n_heads=2)
GLOBAL_BATCH = 8


def batch():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(2, CFG.vocab_size, (GLOBAL_BATCH, CFG.seq_len), generator=g)
    seg = torch.zeros(GLOBAL_BATCH, CFG.seq_len, dtype=torch.long)
    pos = torch.zeros_like(seg)
    for r in range(GLOBAL_BATCH):  # 2-3 documents per row, then padding
        cuts = sorted(torch.randint(1, CFG.seq_len, (2,), generator=g).tolist())
        bounds = [0, cuts[0], cuts[1], CFG.seq_len - r % 3]
        for d in range(3):
            seg[r, bounds[d]:bounds[d + 1]] = d + 1
            pos[r, bounds[d]:bounds[d + 1]] = torch.arange(bounds[d + 1] - bounds[d])
    labels = torch.roll(ids, -1, 1)
    labels[seg != torch.roll(seg, -1, 1)] = IGNORE_INDEX
    labels[seg == 0] = IGNORE_INDEX
    labels[:, -1] = IGNORE_INDEX
    return ids, pos, seg, labels


def reference():
    ids, pos, seg, labels = batch()
    model = build_gpt(CFG)
    valid = (labels != IGNORE_INDEX).sum()
    loss = plain_loss_sum(model(ids, pos, seg), labels) / valid
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    norm = torch.sqrt(sum(g.pow(2).sum() for g in grads.values()))
    return float(loss), grads, float(norm)


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def run_layout(dp, pp, tp, fsdp, ac, microbatches, ref, virtual=1):
    env = init_distributed(types.SimpleNamespace(dp=dp, pp=pp, tp=tp), "cpu")
    specs = rank_stage_specs(partition_model(CFG, pp * virtual), env, virtual)
    stage, views = build_rank_stages(CFG, specs, 0, env.device, loss="chunked", loss_chunk_tokens=48)
    if tp > 1:
        apply_tensor_parallel(stage, env.tp_mesh)
    apply_activation_checkpointing(stage, ac)
    if fsdp:
        apply_fsdp(stage, env.dp_mesh, env.device, reshard_after_forward=pp == 1)

    ids, pos, seg, labels = batch()
    scale = dp / float((labels != IGNORE_INDEX).sum())
    per = GLOBAL_BATCH // dp
    rows = slice(env.dp_rank * per, (env.dp_rank + 1) * per)
    ids, pos, seg, labels = ids[rows], pos[rows], seg[rows], labels[rows]

    def loss_fn(out, target):
        return out.sum() * scale

    loss_sum = torch.zeros(1, dtype=torch.float64)
    if pp == 1:
        for i, (a, b, c, d) in enumerate(zip(*(t.chunk(microbatches) for t in (ids, pos, seg, labels)))):
            loss = loss_fn(stage(a, b, c, d), None)
            loss.backward()
            loss_sum += float(loss.detach())
        counts = tp  # each tp rank computed the same loss
    else:
        pcfg = types.SimpleNamespace(microbatches=microbatches,
                                     schedule="interleaved-1f1b" if virtual > 1 else "1f1b")
        schedule = build_schedule(views, env, pcfg, loss_fn)
        losses = []
        if env.is_first_stage:
            schedule.step(ids, pos, seg, labels)
        elif env.is_last_stage:
            schedule.step(target=labels, losses=losses)
        else:
            schedule.step()
        if env.is_last_stage:
            loss_sum += float(sum(l.detach() for l in losses))
        counts = tp
    if not fsdp:
        allreduce_grads(stage, env, always=tp > 1)
    sync_tied_grad(stage, env)
    norm = clip_grad_norm(stage, 0.0, env)
    dist.all_reduce(loss_sum)
    loss = float(loss_sum) / dp / counts

    ref_loss, ref_grads, ref_norm = ref
    errors = {}
    for name, p in stage.named_parameters():
        g = full(p.grad)
        want = ref_grads["tok_emb.weight" if (name == "head.weight" and "head.weight" not in ref_grads) else name]
        errors[name] = float((g - want).abs().max() / (want.abs().max() + 1e-12))
    return {"layout": f"dp{dp}-pp{pp}-tp{tp}-v{virtual}-{'fsdp' if fsdp else 'nofsdp'}-{ac}", "rank": env.rank,
            "pp_rank": env.pp_rank, "loss": loss, "ref_loss": ref_loss, "norm": norm, "ref_norm": ref_norm,
            "max_rel_grad_error": max(errors.values()), "worst": max(errors, key=errors.get),
            "params": sorted(errors)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--layouts", nargs="+", required=True,
                   help="dp,pp,tp,fsdp(0|1),ac,microbatches[,virtual stages per rank]")
    a = p.parse_args()
    torch.set_num_threads(1)
    ref = reference()
    for spec in a.layouts:
        dp, pp, tp, fsdp, ac, m, *v = spec.split(",")
        res = run_layout(int(dp), int(pp), int(tp), bool(int(fsdp)), ac, int(m), ref, int(v[0]) if v else 1)
        with open(os.path.join(a.out, f"rank{dist.get_rank()}.jsonl"), "a") as f:
            f.write(json.dumps(res) + "\n")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
