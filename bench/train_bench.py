"""Trainer benchmarks (CPU here; the same code runs on GPU hosts).

1. loader: tokens/s of reading the shards per process — TF-free (model_contract framing + CRC + numpy protobuf
   decode), tf.data (TFRecordDataset + parse_example), and the full ShardLoader (streams, shuffle buffer,
   labels) — against the tokens/s one accelerator consumes at a given model size and MFU.
2. bubble: measured pipeline bubble of GPipe, 1F1B and interleaved 1F1B (v virtual stages per rank) with
   torchrun (gloo) for several micro-batch counts, against the theoretical (p-1)/(m+p-1), (p-1)/(vm+p-1)
   interleaved.

    python bench/train_bench.py loader --data out/sample
    python bench/train_bench.py bubble --microbatches 2 4 8
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


# ---------------------------------------------------------------------------------------------- loader
def _first_records(paths, limit: int):
    """The first `limit` records across shards, in order (framing and CRC verified)."""
    from model_contract import read_records

    n = 0
    for p in paths:
        for rec in read_records(p):
            yield rec
            n += 1
            if n >= limit:
                return


def bench_loader(data: str, split: str, max_examples: int, sizes, mfu: float, peak: float) -> dict:
    import numpy as np
    from model_contract import decode_example, load_manifest, manifest_path, resolve_shard_path
    mfile = manifest_path(data)
    manifest = load_manifest(mfile)
    seq_len = manifest.contract.seq_len
    paths = [resolve_shard_path(mfile, s) for s in manifest.shards_for(split)]
    out = {"seq_len": seq_len}

    t0 = time.perf_counter()
    n = 0
    for rec in _first_records(paths, max_examples):
        decode_example(rec)
        n += 1
    dt = time.perf_counter() - t0
    out["tf_free"] = {"examples": n, "examples_per_s": n / dt, "tokens_per_s": n * seq_len / dt}

    t0 = time.perf_counter()
    n = sum(1 for _ in _first_records(paths, max_examples))
    dt = time.perf_counter() - t0
    out["tf_free_framing_only"] = {"tokens_per_s": n * seq_len / dt}

    try:
        import tensorflow as tf
        from model_contract import tf_feature_spec
        spec = {k: v for k, v in tf_feature_spec(manifest.contract).items()
                if k in ("input_ids", "segment_ids", "positions")}
        ds = tf.data.TFRecordDataset(paths).take(max_examples).batch(64).map(
            lambda x: tf.io.parse_example(x, spec))
        for _ in ds.take(1):  # graph build / warm-up outside the timing
            pass
        t0 = time.perf_counter()
        n = 0
        for batch in ds:
            n += int(batch["input_ids"].shape[0])
            np.asarray(batch["input_ids"])
        dt = time.perf_counter() - t0
        out["tf_data"] = {"examples": n, "examples_per_s": n / dt, "tokens_per_s": n * seq_len / dt}
    except ImportError as e:
        out["tf_data"] = {"error": str(e)}

    from trainer.config import DataConfig
    from trainer.data import ShardLoader
    loader = ShardLoader(manifest, mfile, DataConfig(path=data, split=split), seq_len, global_batch=8)
    steps = max(1, min(max_examples // 8, loader.steps_per_epoch))
    t0 = time.perf_counter()
    for _ in range(steps):
        next(loader)
    dt = time.perf_counter() - t0
    out["shard_loader"] = {"tokens_per_s": steps * 8 * seq_len / dt,
                           "read_share": loader.read_seconds / dt, "decode_share": loader.decode_seconds / dt}

    from trainer.config import model_config
    out["consumption"] = {}
    for name in sizes:
        fpt = model_config(name, seq_len=seq_len).flops_per_token()
        need = peak * 1e12 * mfu / fpt
        out["consumption"][name] = {"device_tokens_per_s": need,
                                    "loader_headroom": out["shard_loader"]["tokens_per_s"] / need}
    return out


# ---------------------------------------------------------------------------------------------- bubble
def bubble_worker(args) -> None:
    """Runs under torchrun: time schedule.step vs this rank's own compute for the same micro-batches.

    Stages come from the trainer's own modules (balanced partition, build_rank_stages, build_schedule), so the
    interleaved schedule runs `--virtual-stages` views per rank exactly as training does."""
    import types

    import torch
    import torch.distributed as dist
    from trainer.config import model_config
    from trainer.model import token_loss_sum
    from trainer.mesh import init_distributed
    from trainer.schedule import bubble_fraction, build_rank_stages, build_schedule, rank_stage_specs
    from trainer.partition import partition_model
    torch.set_num_threads(1)
    world = int(os.environ["WORLD_SIZE"])
    env = init_distributed(types.SimpleNamespace(dp=1, pp=world, tp=1), "cpu")
    rank, v = env.rank, args.virtual_stages
    cfg = model_config("tiny", n_layers=args.layers_per_rank * world, d_model=args.d_model, n_heads=4,
                       vocab_size=256, seq_len=args.seq_len)
    specs = rank_stage_specs(partition_model(cfg, world * v), env, v)
    owner, views = build_rank_stages(cfg, specs, 0, env.device)
    mb, m = args.mb_size, args.m
    ids = torch.randint(0, 256, (mb * m, cfg.seq_len))
    pos = torch.arange(cfg.seq_len).expand(mb * m, cfg.seq_len)
    seg = torch.ones(mb * m, cfg.seq_len, dtype=torch.long)
    labels = torch.randint(0, 256, (mb * m, cfg.seq_len))

    def loss_fn(logits, target):
        return token_loss_sum(logits, target) / target.numel()

    sched = build_schedule(views if v > 1 else views[0], env,
                           types.SimpleNamespace(microbatches=m, schedule=args.schedule), loss_fn)

    # Idle time as the schedule sees it: every wait on a pipeline send/receive (bubble + communication).
    import torch.distributed.pipelining.schedules as schedules_mod
    original_wait = schedules_mod._wait_batch_p2p
    waited = [0.0]

    def timed_wait(work):
        t = time.perf_counter()
        try:
            return original_wait(work)
        finally:
            waited[0] += time.perf_counter() - t
    schedules_mod._wait_batch_p2p = timed_wait

    def step():
        if rank == 0:
            sched.step(ids, pos, seg)
        elif rank == world - 1:
            sched.step(target=labels)
        else:
            sched.step()
        dist.barrier()

    for _ in range(2):
        step()
    waited[0] = 0.0
    t0 = time.perf_counter()
    for _ in range(args.iters):
        step()
    pipelined = (time.perf_counter() - t0) / args.iters
    idle = waited[0] / args.iters

    # The same views' compute for m micro-batches, alone (no waiting, no communication).
    x = torch.randn(mb, cfg.seq_len, cfg.d_model, requires_grad=True)

    def compute():
        for _ in range(m):
            for view in views:
                out = view(ids[:mb], pos[:mb], seg[:mb]) if view.first else view(x, seg[:mb])
                out = out[0] if isinstance(out, tuple) else out
                out.float().sum().backward()
    compute()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        compute()
    alone = (time.perf_counter() - t0) / args.iters
    res = torch.tensor([pipelined, alone, idle], dtype=torch.float64)
    allres = [torch.zeros_like(res) for _ in range(world)]
    dist.all_gather(allres, res)
    if rank == 0:
        p = world
        step_time = max(float(r[0]) for r in allres)
        busy = [float(r[1]) for r in allres]
        idle = [float(r[2]) for r in allres]
        print(json.dumps({"schedule": args.schedule, "p": p, "m": m, "v": v, "step_s": step_time,
                          "stage_compute_s": busy, "idle_s": idle,
                          "measured_bubble": (sum(idle) / p) / step_time,
                          "bubble_from_compute_alone": 1 - (sum(busy) / p) / step_time,
                          "theory_bubble": bubble_fraction(p, m, v)}), flush=True)
    dist.destroy_process_group()


def bench_bubble(microbatches, schedules, pp: int, iters: int, d_model: int, seq_len: int, mb_size: int,
                 virtual_stages: int = 2, layers_per_rank: int = 4) -> list:
    rows = []
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    for schedule in schedules:
        v = virtual_stages if schedule == "interleaved-1f1b" else 1
        for m in microbatches:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(pp),
                   os.path.abspath(__file__), "_bubble_worker", "--schedule", schedule, "--num-microbatches", str(m),
                   "--iters", str(iters), "--d-model", str(d_model), "--seq-len", str(seq_len),
                   "--mb-size", str(mb_size), "--virtual-stages", str(v),
                   "--layers-per-rank", str(layers_per_rank)]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            line = [l for l in proc.stdout.splitlines() if l.startswith("{")]
            if proc.returncode or not line:
                raise RuntimeError(proc.stderr[-3000:])
            rows.append(json.loads(line[-1]))
            r = rows[-1]
            print(f"{schedule:>16} p={r['p']} v={r['v']} m={m:>2}: step {r['step_s'] * 1e3:7.1f} ms, idle share "
                  f"{r['measured_bubble']:.3f} vs theory {r['theory_bubble']:.3f}", flush=True)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    lo = sub.add_parser("loader")
    lo.add_argument("--data", default=os.path.join(REPO, "out", "sample"))
    lo.add_argument("--split", default="train")
    lo.add_argument("--max-examples", type=int, default=2000)
    lo.add_argument("--sizes", nargs="+", default=["125M", "1.3B"])
    lo.add_argument("--mfu", type=float, default=0.45)
    lo.add_argument("--peak-tflops", type=float, default=312.0, help="A100 bf16 = 312, H100/H200 = 989")
    bu = sub.add_parser("bubble")
    bu.add_argument("--microbatches", type=int, nargs="+", default=[2, 4, 8])
    bu.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b", "interleaved-1f1b"])
    bu.add_argument("--virtual-stages", type=int, default=2, help="per rank, interleaved-1f1b only")
    bu.add_argument("--layers-per-rank", type=int, default=4)
    bu.add_argument("--pp", type=int, default=2)
    bu.add_argument("--iters", type=int, default=5)
    bu.add_argument("--d-model", type=int, default=128)
    bu.add_argument("--seq-len", type=int, default=128)
    bu.add_argument("--mb-size", type=int, default=4)
    w = sub.add_parser("_bubble_worker")
    w.add_argument("--schedule")
    w.add_argument("--num-microbatches", type=int, dest="m")
    w.add_argument("--iters", type=int)
    w.add_argument("--d-model", type=int)
    w.add_argument("--seq-len", type=int)
    w.add_argument("--mb-size", type=int)
    w.add_argument("--virtual-stages", type=int, default=1)
    w.add_argument("--layers-per-rank", type=int, default=4)
    a = p.parse_args(argv)
    if a.cmd == "_bubble_worker":
        bubble_worker(a)
        return 0
    if a.cmd == "loader":
        res = bench_loader(a.data, a.split, a.max_examples, a.sizes, a.mfu, a.peak_tflops)
        print(json.dumps(res, indent=1))
        tf_free = res["tf_free"]["tokens_per_s"]
        tfd = res["tf_data"].get("tokens_per_s")
        print(f"TF-free parse: {tf_free / 1e6:.1f} M tokens/s; tf.data: "
              f"{(tfd or 0) / 1e6:.1f} M tokens/s; ShardLoader: {res['shard_loader']['tokens_per_s'] / 1e6:.1f} M tokens/s")
        for name, c in res["consumption"].items():
            print(f"{name}: one device at {100 * a.mfu:.0f}% MFU of {a.peak_tflops} TFLOP/s consumes "
                  f"{c['device_tokens_per_s']:,.0f} tokens/s; loader headroom x{c['loader_headroom']:.1f}")
        return 0
    rows = bench_bubble(a.microbatches, a.schedules, a.pp, a.iters, a.d_model, a.seq_len, a.mb_size,
                        a.virtual_stages, a.layers_per_rank)
    print("\n| schedule | p | v | m | step ms | idle share (waits) | 1 - compute alone / step | theory "
          "(p-1)/(vm+p-1) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['schedule']} | {r['p']} | {r['v']} | {r['m']} | {r['step_s'] * 1e3:.1f} | "
              f"{r['measured_bubble']:.3f} | {r['bubble_from_compute_alone']:.3f} | {r['theory_bubble']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
