"""torchrun worker for the layout equality tests (tests/e2e/test_trainer_layouts.py).

Every rank first computes the single-process reference: the unparallelised model, STEPS optimizer steps of plain
(single-tensor) AdamW on the same global batches, gradient clipping and the trainer's LR schedule. Then, for each
requested layout, it builds its stage(s) through the trainer itself (`Trainer.build_model`: process groups and
mesh, partition, tensor parallel, activation checkpointing, FSDP2 / DDP, ZeRO, the AdamW grouping) and runs
`Trainer.train_step` STEPS times on its data-parallel share of the same batches. Per layout and rank one JSON line
goes to --out: every step's loss and gradient norm, the first step's gradient error and every parameter's error
after the last optimizer step, each relative to the reference.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

from trainer.config import OptimConfig, ParallelConfig, TrainConfig, model_config
from trainer.loss import IGNORE_INDEX, plain_loss_sum
from trainer.model import GPTStage
from trainer.retro import RetroSpec
from trainer.optim import lr_at
from trainer.train import Trainer

CFG = model_config("tiny", seq_len=32, vocab_size=64, n_layers=3, d_model=32, n_heads=2)
GLOBAL_BATCH, STEPS = 8, 2
# chunked cross-attention after blocks 0 and 2: with pp 2 one RETRO layer lives on each stage
RETRO = RetroSpec(layers=(0, 2), chunk_len=8, neighbour_len=16, pad_id=0)
# grad_clip acts on step 1 (norm ~0.94), not on step 2 (~0.44). The weight decay is large so that a parameter
# in the wrong decay group moves by ~1% per step (lr x wd), far above the comparison's tolerance.
OPTIM = dict(lr=1e-3, warmup_steps=1, weight_decay=10.0, grad_clip=0.5)
# Parameters are compared element by element as |got - want| <= RTOL |want| + ATOL. ATOL is 1% of one step's
# largest AdamW update (lr): elements whose gradient is float noise (the key bias of qkv, exactly 0 in exact
# arithmetic) get updates of +-lr x g / (|g| + eps) that no summation order reproduces.
RTOL, ATOL = 1e-4, 1e-2 * OPTIM["lr"]


def batch(step: int, retro: bool) -> dict:
    """Global batch of `step`: 2-3 documents per row, then padding; with `retro` neighbours per 8-token chunk."""
    g = torch.Generator().manual_seed(7 + step)
    ids = torch.randint(2, CFG.vocab_size, (GLOBAL_BATCH, CFG.seq_len), generator=g)
    seg = torch.zeros(GLOBAL_BATCH, CFG.seq_len, dtype=torch.long)
    pos = torch.zeros_like(seg)
    for r in range(GLOBAL_BATCH):
        cuts = sorted(torch.randint(1, CFG.seq_len, (2,), generator=g).tolist())
        bounds = [0, cuts[0], cuts[1], CFG.seq_len - r % 3]
        for d in range(3):
            seg[r, bounds[d]:bounds[d + 1]] = d + 1
            pos[r, bounds[d]:bounds[d + 1]] = torch.arange(bounds[d + 1] - bounds[d])
    labels = torch.roll(ids, -1, 1)
    labels[seg != torch.roll(seg, -1, 1)] = IGNORE_INDEX
    labels[seg == 0] = IGNORE_INDEX
    labels[:, -1] = IGNORE_INDEX
    out = {"input_ids": ids, "positions": pos, "segment_ids": seg, "labels": labels}
    if retro:
        chunks, k = CFG.seq_len // RETRO.chunk_len, 2
        out["neighbour_tokens"] = torch.randint(0, CFG.vocab_size, (GLOBAL_BATCH, chunks, k, RETRO.neighbour_len),
                                                generator=g)
        doc = torch.randint(0, 100, (GLOBAL_BATCH, chunks, k), generator=g)
        doc[:, -1, 1] = -1  # a missing neighbour (masked out)
        out["neighbour_doc_ids"] = doc
    return out


def reference(retro: bool) -> dict:
    """One process: losses, first-step gradients and norm, parameters after STEPS steps."""
    cfg = TrainConfig(model=CFG, optim=OptimConfig(**OPTIM), steps=STEPS)
    model = GPTStage(CFG, range(CFG.n_layers), first=True, last=True, seed=0, retro=RETRO if retro else None)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": OPTIM["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}], lr=OPTIM["lr"], betas=(0.9, 0.95),
                            foreach=False)
    init = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses, norms, grads = [], [], None
    for step in range(STEPS):
        b = batch(step, retro)
        args = [b["input_ids"], b["positions"], b["segment_ids"]]
        if retro:
            args += [b["neighbour_tokens"], b["neighbour_doc_ids"]]
        loss = plain_loss_sum(model(*args), b["labels"]) / (b["labels"] != IGNORE_INDEX).sum()
        loss.backward()
        if grads is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM["grad_clip"])))
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return {"losses": losses, "norms": norms, "grads": grads, "init": init,
            "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class StepTrainer(Trainer):
    """The trainer without a dataset: its loader is this rank's share of the worker's batches, and the first
    step's gradients are kept (after the gradient sync, before clipping)."""

    def __init__(self, cfg, batches, retro):
        super().__init__(cfg)
        self.retro = retro
        self.loader = iter(batches)
        self.first_grads = None

    def sync_grads(self):
        super().sync_grads()
        if self.first_grads is None:
            self.first_grads = {n: full(p.grad).detach().clone() for n, p in self.module.named_parameters()
                                if p.grad is not None}


def parse(spec: str) -> dict:
    """'dp=2,pp=2,tp=1,fsdp=0,zero=0,ac=none,m=2,v=1,retro=0,adamw=foreach' (any subset; these defaults)."""
    o = {"dp": 1, "pp": 1, "tp": 1, "fsdp": 0, "zero": 0, "ac": "none", "m": 1, "v": 1, "retro": 0,
         "adamw": "foreach", "schedule": ""}
    for item in spec.split(","):
        k, v = item.split("=")
        o[k] = type(o[k])(v) if not isinstance(o[k], str) else v
    return o


def tag(o: dict) -> str:
    return ",".join(f"{k}={o[k]}" for k in sorted(o))


def relerr(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / (want.abs().max() + 1e-12))


def excess(got: torch.Tensor, want: torch.Tensor) -> float:
    """How far the worst element is beyond RTOL (<= ATOL passes)."""
    return float(((got - want).abs() - RTOL * want.abs()).max())


def run_layout(o: dict, ref: dict) -> dict:
    local = GLOBAL_BATCH // o["dp"]
    schedule = o["schedule"] or ("interleaved-1f1b" if o["v"] > 1 else "1f1b")
    pcfg = ParallelConfig(dp=o["dp"], pp=o["pp"], tp=o["tp"], fsdp=bool(o["fsdp"]), zero=bool(o["zero"]),
                          ac=o["ac"], microbatches=o["m"], microbatch_size=local // o["m"], schedule=schedule,
                          virtual_stages=o["v"])
    cfg = TrainConfig(model=CFG, parallel=pcfg, optim=OptimConfig(**OPTIM, adamw=o["adamw"]), steps=STEPS,
                      device="cpu", loss="chunked")
    dp_rank = int(os.environ["RANK"]) // (o["pp"] * o["tp"])
    rows = slice(dp_rank * local, (dp_rank + 1) * local)
    batches = [{k: v[rows] for k, v in batch(s, bool(o["retro"])).items()} for s in range(STEPS)]
    t = StepTrainer(cfg, batches, RETRO if o["retro"] else None)
    t.build_model()
    t.build_schedule()
    steps = [t.train_step() for _ in range(STEPS)]
    grad_err = {}
    for name, g in t.first_grads.items():
        # the last stage's copy of the tied embedding holds the whole tied gradient after sync_tied_grad
        grad_err[name] = relerr(g, ref["grads"].get(name, ref["grads"]["tok_emb.weight"]))
    want = {name: ref["params"].get(name, ref["params"]["tok_emb.weight"]) for name, _ in t.module.named_parameters()}
    got = {name: full(p.detach()) for name, p in t.module.named_parameters()}
    return {"layout": tag(o), "rank": int(os.environ["RANK"]), "optimizer": type(t.optimizer).__name__,
            "param_groups": len(t.optimizer.param_groups), "fused": bool(t.optimizer.defaults.get("fused")),
            "losses": [float(s.loss) for s in steps], "ref_losses": ref["losses"],
            "norms": [float(s.grad_norm) for s in steps], "ref_norms": ref["norms"],
            "max_rel_grad_error": max(grad_err.values()), "worst_grad": max(grad_err, key=grad_err.get),
            "param_excess": {n: excess(got[n], want[n]) for n in got}, "atol": ATOL,
            "moved": min(relerr(want[n], ref["init"].get(n, ref["init"]["tok_emb.weight"])) for n in got),
            "params": sorted(got)}


def end_of_layout_barrier(layout: str, timeout_s: float = 120.0) -> None:
    """A barrier that cannot hang the module: when only some ranks fail a layout (an error before a pipeline
    send), the others wait in a recv that never returns, and a plain barrier turned that into a 330 s timeout
    of every layout (the varlen wiring's AttributeError on the interleaved views, trainer/model.py stage_view).
    gloo's monitored barrier names the ranks that did not arrive; then this rank exits and torchrun stops the
    rest, so the test fails at once with the error lines already written."""
    if dist.get_backend() != "gloo":
        dist.barrier()
        return
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as e:
        print(f"layout {layout}: ranks did not reach the barrier: {e}"[:2000], file=sys.stderr, flush=True)
        os._exit(3)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--layouts", nargs="+", required=True, help="key=value,... (see parse)")
    a = p.parse_args()
    torch.set_num_threads(1)
    refs: dict = {}
    for spec in a.layouts:
        o = parse(spec)
        if o["retro"] not in refs:
            refs[o["retro"]] = reference(bool(o["retro"]))
        try:
            res = run_layout(o, refs[o["retro"]])
        except Exception as e:  # noqa: BLE001 - every rank fails alike (a kernel refusing its inputs): report it
            res = {"layout": tag(o), "rank": int(os.environ["RANK"]), "error": f"{type(e).__name__}: {e}"[:2000]}
        with open(os.path.join(a.out, f"rank{dist.get_rank()}.jsonl"), "a") as f:
            f.write(json.dumps(res) + "\n")
        end_of_layout_barrier(tag(o))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
