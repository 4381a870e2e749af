"""Memory plan: per-GPU bytes of a model x layout x GPU, before anything is launched.

    python -m trainer.plan --model 1.3B --gpu A100-40GB --dp 8 --fsdp --micro-batch 4 --ac selective
    python -m trainer.plan --model 6.7B --gpu A100-40GB --nodes 4 --tp 8 --pp 2 --global-batch 512

The estimate is analytic (so it runs on a laptop for a 6.7B model) and counts, for the most loaded rank:
- parameters: fp32 master weights (sharded over dp under FSDP; matmul weights / tp), plus under FSDP the bf16
  all-gathered copies of the blocks in flight, or without FSDP the bf16 copies autocast keeps for backward;
- gradients (fp32, sharded under FSDP) and AdamW state (2 x fp32, sharded under FSDP or ZeRO-1);
- activations per block and micro-batch, counted tensor by tensor (what autograd saves; Korthikanti et al.
  2022 without dropout): 8 d + 2 d_ff per token without checkpointing, 7 d + d_ff with selective (outputs of
  the matmuls and attention kept), d with full (plus one block recomputed at a time). The
  schedule decides how many micro-batches are in flight on the first stage: 1 without PP, m for GPipe, pp for
  1F1B, and (v-1) p + 2 (p-1) + 1 virtual-stage chunks for interleaved 1F1B;
- the loss: [B, T, V] logits in bf16 plus fp32 log-probabilities and their gradient, or one chunk of them with
  the chunked loss;
- communication buffers: with dp > 1 DDP's or trainer/grad_sync.py's buckets (a second copy of the gradients),
  FSDP all-gather / reduce-scatter buffers, pipeline send/receive buffers;
- a fixed CUDA context + allocator margin.
It refuses a layout whose total exceeds the GPU's memory. Checked on CPU against torch's own accounting
(`torch.distributed._tools.mem_tracker.MemTracker`) in tests/unit/trainer/test_plan.py.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass, field
from typing import Optional

from trainer.config import ModelConfig, model_config

GiB = 2**30
GPUS = {  # device memory the caching allocator can use, bytes: torch.cuda.get_device_properties().total_memory,
    # below the marketing sizes (40 / 80 / 141 GB) and nvidia-smi's totals; CUDA_CONTEXT comes off on top
    "A100-40GB": int(39.4 * GiB), "A100-80GB": int(79.1 * GiB), "H100": int(79.1 * GiB), "H200": int(140.0 * GiB),
}
CUDA_CONTEXT = int(1.5 * GiB)  # CUDA context, cuBLAS/NCCL workspaces: outside the caching allocator
FRAGMENTATION = 0.10  # caching-allocator slack on top of the live bytes

AC_MODES = ("none", "selective", "full")


@dataclass
class Layout:
    dp: int = 1
    pp: int = 1
    tp: int = 1
    fsdp: bool = False
    zero: bool = False
    micro_batch: int = 1  # sequences per micro-batch
    microbatches: int = 1  # per rank and step
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved-1f1b
    virtual_stages: int = 1
    ac: str = "none"  # none | selective | full
    loss: str = "chunked"  # chunked | logits
    loss_chunk_tokens: int = 4096
    bf16: bool = True
    device: str = "cuda"  # cpu: fp32, math attention, no CUDA context
    attention: str = "flex"  # sdpa (dense mask) | flex | varlen


@dataclass
class Plan:
    model: str
    layout: dict[str, int | bool | str]  # asdict(Layout)
    gpu: str
    capacity: int
    parts: dict[str, int] = field(default_factory=dict)  # name -> bytes
    total: int = 0
    fits: bool = True
    stage_params: int = 0
    peak_at: str = ""

    def format(self) -> str:
        lines = [f"memory plan: {self.model} on {self.gpu} ({self.capacity / GiB:.1f} GiB); "
                 + ", ".join(f"{k}={v}" for k, v in self.layout.items() if k in
                             ("dp", "pp", "tp", "fsdp", "zero", "micro_batch", "microbatches", "schedule",
                              "virtual_stages", "ac", "loss"))]
        lines.append(f"  params of the most loaded stage (per tp rank, before FSDP sharding): "
                     f"{self.stage_params / 1e6:,.1f}M")
        for k, v in self.parts.items():
            lines.append(f"  {k:<28} {v / GiB:8.2f} GiB")
        verdict = "fits" if self.fits else "DOES NOT FIT"
        lines.append(f"  {'peak (' + self.peak_at + ')':<28} {self.total / GiB:8.2f} GiB of "
                     f"{self.capacity / GiB:.1f} GiB: {verdict}")
        return "\n".join(lines)


def _stage_params(cfg: ModelConfig, lay: Layout) -> tuple[int, int, int]:
    """(replicated params, tp-sharded matmul params, blocks) of the most loaded rank (all its virtual stages)."""
    from trainer.partition import partition_model
    n_stages = lay.pp * lay.virtual_stages
    specs = partition_model(cfg, n_stages) if n_stages > 1 else None
    d, f, v, t = cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.seq_len
    block_matmul = 3 * d * d + 3 * d + d * d + d * f + f + f * d  # colwise/rowwise-sharded under TP
    block_repl = cfg.block_params() - block_matmul
    best = None
    ranks = range(lay.pp) if specs else [0]
    for r in ranks:
        mine = [specs[r + k * lay.pp] for k in range(lay.virtual_stages)] if specs else None
        first = mine is None or any(s.first for s in mine)
        last = mine is None or any(s.last for s in mine)
        blocks = cfg.n_layers if mine is None else sum(len(s.layers) for s in mine)
        repl = blocks * block_repl + (v * d + t * d if first else 0) + (2 * d if last else 0)
        if last and (not cfg.tie_embeddings or specs is not None):
            repl += v * d  # the head (a copy of the tied embedding on the last pipeline stage)
        sharded = blocks * block_matmul
        key = repl + sharded / lay.tp
        if best is None or key > best[0]:
            best = (key, repl, sharded, blocks, first, last)
    _, repl, sharded, blocks, first, last = best
    return repl, sharded, blocks, first, last


def in_flight(lay: Layout) -> float:
    """Micro-batches' worth of block activations held at once on the first pipeline rank, in units of the
    rank's blocks (interleaved: chunks of 1/v of them)."""
    p, m, v = lay.pp, lay.microbatches, lay.virtual_stages
    if p == 1:
        return 1
    if lay.schedule == "gpipe":
        return m
    if lay.schedule == "interleaved-1f1b":
        chunks = min(m * v, (v - 1) * p + 2 * (p - 1) + 1)
        return chunks / v
    return min(m, p)


class LayoutDoesNotFit(ValueError):
    pass


def estimate(cfg: ModelConfig, lay: Layout, gpu: str = "A100-40GB") -> Plan:
    if gpu not in GPUS and lay.device == "cuda":
        raise ValueError(f"unknown --gpu {gpu!r}; choose one of {', '.join(GPUS)}")
    repl, sharded, blocks, first, last = _stage_params(cfg, lay)
    n = repl + sharded / lay.tp  # parameters this rank computes with
    cuda = lay.device == "cuda"
    half = 2 if (cuda and lay.bf16) else 4  # bytes of compute-dtype activations / weight copies
    shard = lay.dp if lay.fsdp else 1
    parts = {}
    parts["parameters (fp32)"] = 4 * n / shard
    if lay.fsdp:
        per_block = (cfg.block_params() - (3 * cfg.d_model ** 2 + cfg.d_model * cfg.d_ff * 2) * (1 - 1 / lay.tp))
        gathered = 2 if lay.pp == 1 else blocks  # pp: kept unsharded across micro-batches
        parts["FSDP gathered params"] = half * per_block * gathered + half * (n - blocks * per_block) * (lay.dp > 1)
    elif cuda and lay.bf16:
        parts["autocast bf16 weight copies"] = 2 * n
    parts["gradients (fp32)"] = 4 * n / shard
    if lay.fsdp and lay.dp > 1 and (lay.microbatches > 1 or lay.pp > 1):
        # gradient sync is off until the last micro-batch (trainer/train.py, PipelineStage): FSDP2 holds the
        # unsharded fp32 gradients of the stage until the reduce-scatter (~4.9 GiB at 1.3B)
        parts["FSDP unsharded grads (accumulation)"] = 4 * n * (1 - 1 / shard)
    parts["AdamW state (2 x fp32)"] = 8 * n / (lay.dp if (lay.fsdp or lay.zero) else 1)

    d, f, t = cfg.d_model, cfg.d_ff, cfg.seq_len
    tokens = lay.micro_batch * t
    tp = lay.tp
    # Saved per token and block (fused attention keeps q, k, v and its output, never the T x T scores):
    #   none:      x, ln1 out, q, k, v, attention out, x + attn, ln2 out (8 d) + fc out, gelu out (2 f)
    #   selective: x + outputs of qkv, attention, proj, fc, out (7 d + f)
    #   full:      x (d)
    # Residual-stream tensors (x, x + attn) stay fp32 under autocast; the rest is in the compute dtype; tensor
    # parallelism splits everything but the residual stream and the LayerNorm outputs.
    if lay.ac == "none":
        per_tok = 4 * 2 * d + half * (2 * d + (6 * d + 2 * f) / tp)
    elif lay.ac == "selective":
        per_tok = 4 * d + half * (6 * d + f) / tp
    else:
        per_tok = 4 * d
    stored = per_tok * tokens * blocks * in_flight(lay)
    parts["activations"] = stored
    # the backward of a checkpointed block rebuilds what was not kept: the whole block (full), or the
    # LayerNorm and GELU outputs (selective)
    recompute = {"none": 0, "selective": half * (2 * d + f / tp),
                 "full": 8 * d + half * (2 * d + (6 * d + 2 * f) / tp)}[lay.ac] * tokens
    mask = lay.micro_batch * t * t if lay.attention == "sdpa" else lay.micro_batch * (t // 128 + 1) ** 2 * 8
    parts["attention masks"] = mask * (in_flight(lay) if lay.pp > 1 else 1)
    loss_bytes = 0
    if last:
        v = cfg.vocab_size
        logit_tokens = tokens if lay.loss == "logits" else min(tokens, lay.loss_chunk_tokens)
        loss_bytes = logit_tokens * v * (half + 4 + (4 if half != 4 else 0))  # logits, fp32 copy, log-probs
        parts["logits + loss"] = loss_bytes
    if first:
        parts["embedding output"] = tokens * d * 4 * (in_flight(lay) if lay.pp > 1 else 1)
    comm = 0
    if lay.dp > 1 and not lay.fsdp:
        comm += 4 * n  # DDP's or trainer/grad_sync.py's flat buckets (pp / tp stages): a second copy of the gradients
    if lay.fsdp and lay.dp > 1:
        comm += 4 * cfg.block_params() / lay.tp * 2  # reduce-scatter input/output of one block, fp32
    if lay.pp > 1:
        comm += 2 * tokens * d * half * 2  # send + receive buffers, activations and their gradients
    parts["communication buffers"] = comm

    # The peak is the larger of two moments: the end of the forward (every stored activation, the loss and,
    # when gradients accumulate over micro-batches, the gradients) and the optimizer step (foreach AdamW
    # holds about one more fp32 copy of the parameters in temporaries). With checkpointing the backward also
    # holds one recomputed block.
    grads = parts["gradients (fp32)"] + parts.get("FSDP unsharded grads (accumulation)", 0)
    accumulating = lay.microbatches > 1 or lay.pp > 1
    weights = parts["parameters (fp32)"] + parts.get("FSDP gathered params", 0) + parts.get(
        "autocast bf16 weight copies", 0) + parts["AdamW state (2 x fp32)"]
    forward_end = (weights + (grads if accumulating else 0) + stored + parts["attention masks"] + loss_bytes
                   + parts.get("embedding output", 0) + comm)
    backward = weights + grads + stored + parts["attention masks"] + recompute + comm
    step = weights + grads + 4 * n / shard + comm
    # listed as parts; counted per moment above
    peak_name = max((("end of forward", forward_end), ("backward", backward), ("optimizer step", step)),
                    key=lambda kv: kv[1])
    live = peak_name[1]
    extra = {}
    if cuda:
        extra["allocator slack (10%)"] = FRAGMENTATION * live
        extra["CUDA context"] = CUDA_CONTEXT
    total = int(live + sum(extra.values()))
    parts.update(extra)
    capacity = GPUS.get(gpu, 0)
    plan = Plan(cfg.name, asdict(lay), gpu if cuda else "cpu", capacity, {k: int(v) for k, v in parts.items()},
                total, (not cuda) or total <= capacity, int(n))
    plan.peak_at = peak_name[0]
    return plan


def derive_microbatches(global_batch: int, dp: int, pp: int, micro_batch: int) -> int:
    """Micro-batches per rank for the user's global batch (trainer/README.md, "Batch rules": the global batch is
    the recipe; the micro-batch count follows from it and the layout). With pp > 1 at least pp of them, and the
    defaults aim for 4 x pp (bubble <= (p-1)/(5p-1) < 20%)."""
    if global_batch % dp:
        raise ValueError(f"global batch {global_batch} does not split over dp={dp}")
    local = global_batch // dp
    if local % micro_batch:
        raise ValueError(f"per-rank batch {local} does not split into micro-batches of {micro_batch}")
    m = local // micro_batch
    if pp > 1 and m < pp:
        raise ValueError(f"per-rank batch {local} at micro-batch {micro_batch} gives {m} micro-batches < pp={pp}")
    return m


def choose_micro_batch(cfg: ModelConfig, lay: Layout, global_batch: int, gpu: str,
                       sizes=(16, 8, 4, 2, 1)) -> Plan:
    """The largest micro-batch size that divides the per-rank batch, leaves >= 4 x pp micro-batches when
    pipelining (fewer only if the batch is too small for that) and fits on `gpu`; raises LayoutDoesNotFit."""
    import dataclasses
    local = global_batch // lay.dp if global_batch % lay.dp == 0 else 0
    if not local:
        raise ValueError(f"global batch {global_batch} does not split over dp={lay.dp}")
    want = 4 * lay.pp if lay.pp > 1 else 1
    candidates = [mb for mb in sizes if local % mb == 0 and local // mb >= want]
    candidates += [mb for mb in sizes if local % mb == 0 and lay.pp <= local // mb < want]
    last = None
    for mb in candidates:
        trial = dataclasses.replace(lay, micro_batch=mb, microbatches=local // mb)
        plan = estimate(cfg, trial, gpu)
        if plan.fits:
            return plan
        if last is None or mb < last.layout["micro_batch"]:
            last = plan  # the smallest micro-batch tried: the one the error reports
    if last is None:
        raise ValueError(f"per-rank batch {local} cannot make >= pp={lay.pp} micro-batches")
    raise LayoutDoesNotFit(f"{cfg.name} with dp={lay.dp} pp={lay.pp} tp={lay.tp} fsdp={lay.fsdp} ac={lay.ac} does "
                           f"not fit on {gpu} even at micro-batch {last.layout['micro_batch']} "
                           f"({last.total / GiB:.1f} GiB): shard more (--fsdp, --tp, --pp) or checkpoint (--ac)")


def local_gpu() -> Optional[str]:
    """The GPUS key of this machine's CUDA device 0 (None without CUDA or for an unknown model)."""
    import torch
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(0)
    mem = torch.cuda.get_device_properties(0).total_memory
    if "H200" in name:
        return "H200"
    if "H100" in name:
        return "H100"
    if "A100" in name:
        return "A100-80GB" if mem > 50 * GiB else "A100-40GB"
    return None


def plan_for_config(cfg, choose_micro_batch_size: bool = False) -> Plan:
    """The plan of a resolved trainer.config.TrainConfig (after resolve_layout) on cfg.gpu or the local GPU; a
    CPU run (no GPU named, none present, or --device cpu) gets a CPU plan, which always "fits".

    choose_micro_batch_size (the user gave neither --microbatches nor --microbatch-size): on a known GPU, set
    the largest micro-batch that fits (>= 4 x pp micro-batches when pipelining) into cfg.parallel; raises
    LayoutDoesNotFit when none does."""
    p = cfg.parallel
    gpu = cfg.gpu or (local_gpu() if cfg.device != "cpu" else None)
    if gpu is not None and gpu not in GPUS:
        from trainer.config import ConfigError
        raise ConfigError(f"unknown --gpu {gpu!r}; choose one of {', '.join(GPUS)}")
    attention = cfg.attention if cfg.attention != "auto" else ("flex" if gpu else "sdpa")
    lay = Layout(dp=p.dp, pp=p.pp, tp=p.tp, fsdp=p.fsdp, zero=p.zero, micro_batch=p.microbatch_size,
                 microbatches=p.microbatches, schedule=p.schedule, virtual_stages=p.virtual_stages, ac=p.ac,
                 loss=cfg.loss, bf16=cfg.bf16, device="cuda" if gpu else "cpu", attention=attention)
    if choose_micro_batch_size and gpu:
        plan = choose_micro_batch(cfg.model, lay, cfg.global_batch, gpu)
        p.microbatch_size, p.microbatches = plan.layout["micro_batch"], plan.layout["microbatches"]
        return plan
    return estimate(cfg.model, lay, gpu or "A100-40GB")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="trainer.plan", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="1.3B")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--gpu", default="A100-40GB", choices=sorted(GPUS))
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--dp", type=int, help="default: nodes x gpus-per-node / (pp x tp)")
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--zero", action="store_true")
    p.add_argument("--global-batch", type=int, default=0, help="sequences per step (0: micro-batch x m x dp)")
    p.add_argument("--micro-batch", type=int)
    p.add_argument("--microbatches", type=int)
    p.add_argument("--schedule", default="1f1b", choices=["gpipe", "1f1b", "interleaved-1f1b"])
    p.add_argument("--virtual-stages", type=int, default=1)
    p.add_argument("--ac", default="none", choices=AC_MODES)
    p.add_argument("--loss", default="chunked", choices=["chunked", "logits"])
    p.add_argument("--attention", default="flex", choices=["sdpa", "flex", "varlen"])
    p.add_argument("--no-bf16", action="store_true")
    a = p.parse_args(argv)
    try:
        cfg = model_config(a.model, seq_len=a.seq_len, vocab_size=a.vocab_size)
        world = a.nodes * a.gpus_per_node
        dp = a.dp or world // (a.pp * a.tp)
        if dp * a.pp * a.tp != world and not a.dp:
            raise ValueError(f"{world} GPUs do not split into pp={a.pp} x tp={a.tp}")
        lay = Layout(dp=dp, pp=a.pp, tp=a.tp, fsdp=a.fsdp, zero=a.zero, micro_batch=a.micro_batch or 1,
                     microbatches=a.microbatches or (4 * a.pp if a.pp > 1 else 1), schedule=a.schedule,
                     virtual_stages=a.virtual_stages, ac=a.ac, loss=a.loss, attention=a.attention,
                     bf16=not a.no_bf16)
        if a.global_batch and not a.micro_batch:
            plan = choose_micro_batch(cfg, lay, a.global_batch, a.gpu)
        else:
            if a.global_batch:
                lay.microbatches = derive_microbatches(a.global_batch, dp, a.pp, lay.micro_batch)
            plan = estimate(cfg, lay, a.gpu)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(plan.format())
    if not plan.fits:
        print(f"error: layout does not fit on {a.gpu}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
