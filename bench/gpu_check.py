"""One short, prepared GPU check (about 9 minutes at most on one H200), versions first.

Runs from a plain checkout on torch 2.11-2.13 with only torch and numpy installed (no install step: the repository
goes on sys.path, and ahead of PYTHONPATH for the trainer's subprocess; what 2.13 added is feature-detected in
trainer/; tests/e2e/test_gpu_check_bare_venv.py runs --tiny in such a venv). Sections, in order, each under its
own time limit and with its deadline checked inside; the JSON (--out/gpu_check.json) is rewritten as soon as a
part of a section exists (each variant of `step`, the first run of `cli`), so a timeout keeps what finished;
finished sections are skipped when the script is rerun (--force reruns them):

1. versions  torch / CUDA / Python / device (also printed first, before any section), the peak FLOP/s used for
             MFU, which modules the loader needs are importable, which CRC-32C implementation reads the shards
             (printed first too: model_contract/crc32c.py), and which SDPA backends accept the dense mask.
2. step      a training step of the 1.3B model (seq 2048, bf16) built on the device, through the trainer's own
             choices (attention kernel, AdamW kernel, compile per block, parameter groups): before (dense-mask
             SDPA, eager, [B,T,V] logits, foreach AdamW) / after-no-compile / after. Tokens/s from synchronised
             wall time, MFU (6N + 12·L·d·T) and the executed-work HFU, peak memory, compile time, first-step
             loss (must agree across variants).
3. attention forward + backward of dense-mask SDPA, flex and varlen at B=8, H=16, T=2048, D=128 for two
             document-length mixes (short Pile-like documents, long ones).
4. loader    steady tokens/s of the trainer's ShardLoader on synthetic shards.
5. cli       `python -m trainer.train` on 125M with --compile, stopped at a step with a checkpoint, then resumed.

    python bench/gpu_check.py                 # on the GPU machine
    python bench/gpu_check.py --tiny          # CPU, tiny shapes (tests/unit/trainer/test_gpu_check.py)
    python bench/gpu_check.py --variants before after-no-compile after   # (the default)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

SECTIONS = ("versions", "step", "attention", "loader", "cli")
# seconds; cold compiles dominate: step = three 1.3B variants (one compiled per block), cli = two --compile runs
# with NCCL/process start-up each. Sum ~9 minutes: inside a 15-minute GPU session with room for one rerun of a
# section (finished sections are skipped).
LIMITS = {"versions": 20, "step": 270, "attention": 60, "loader": 30, "cli": 150}

# name -> (attention, compile per block, loss, AdamW kernel); "auto" resolves as the trainer does on the device
VARIANTS = {
    "before": ("sdpa", False, "logits", "foreach"),
    "after-no-compile": ("auto", False, "chunked", "auto"),
    "after": ("auto", True, "chunked", "auto"),
}


class SectionTimeout(BaseException):
    """BaseException, so a section's own `except Exception` (recording a kernel that fails) cannot swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """SIGALRM-based limit: interrupts Python code (compilation included) in the main thread."""
    def handler(signum, frame):
        raise SectionTimeout(f"over its {seconds:.0f} s limit")
    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def with_repo_path(pythonpath):
    """PYTHONPATH for the trainer's subprocess: the repository first, then whatever was set (wheels carried
    beside the checkout on a machine with no network must stay importable), never replaced."""
    parts = [p for p in (pythonpath or "").split(os.pathsep) if p and os.path.abspath(p) != REPO]
    return os.pathsep.join([REPO] + parts)


def crc32c_line() -> str:
    from model_contract import crc32c
    return f"crc32c {crc32c.IMPLEMENTATION}"


def _sync(device):
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize()


def _device(args):
    import torch
    kind = args.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(kind)


def _doc_segments(b: int, t: int, mean_len: int, seed: int):
    """segment_ids [b, t] of packed documents with lengths ~ exponential(mean_len), >= 1 token."""
    import torch
    g = torch.Generator().manual_seed(seed)
    seg = torch.empty(b, t, dtype=torch.long)
    for r in range(b):
        pos, doc = 0, 1
        while pos < t:
            n = max(1, int(torch.empty(1).exponential_(1.0 / mean_len, generator=g)))
            seg[r, pos:pos + n] = doc
            pos, doc = pos + n, doc + 1
    return seg


# ---------------------------------------------------------------------------------------------- sections
def section_step(args, device, deadline, record):
    import torch
    from trainer.attention import resolve_impl
    from trainer.config import model_config
    from trainer.loss import IGNORE_INDEX, plain_loss_sum
    from trainer.metrics import attended_keys_per_token, hardware_flops_per_token, peak_tflops
    from trainer.model import build_gpt, compile_blocks
    from trainer.optim import adamw_impl, param_groups
    if args.tiny:
        cfg = model_config("tiny", seq_len=64, vocab_size=256, n_layers=2, d_model=64, n_heads=4)
        batch, steps = 2, 2
    else:
        cfg = model_config("1.3B")
        batch, steps = args.micro_batch, args.steps
    t = cfg.seq_len
    seg_host = _doc_segments(batch, t, min(300, t // 3), seed=1)
    seg = seg_host.to(device)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, t), generator=g).to(device)
    starts = torch.ones_like(seg, dtype=torch.bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    idx = torch.arange(t, device=device).expand(batch, t)
    pos = idx - torch.cummax(torch.where(starts, idx, torch.zeros_like(idx)), dim=1).values
    labels = torch.roll(ids, -1, 1)
    labels[torch.roll(seg, -1, 1) != seg] = IGNORE_INDEX
    peak = peak_tflops(device)
    hw_flops = hardware_flops_per_token(cfg, attended_keys_per_token(seg_host))
    out = {"model": cfg.name, "micro_batch": batch, "seq_len": t, "flop_convention": "6N+12LdT",
           "peak_tflops": peak, "variants": {}}
    results = out["variants"]
    for name in args.variants:
        if deadline - time.monotonic() < 5:
            results[name] = {"status": "skipped", "reason": "section time spent"}
            continue
        want_attention, compiled, loss_mode, adamw = VARIANTS[name]
        # the trainer's own choices on this device (CPU: sdpa, foreach; CUDA: flex, fused)
        attention = resolve_impl(want_attention, device)
        adamw = adamw_impl(adamw, device)
        backend = "inductor" if device.type == "cuda" else "aot_eager"  # CPU: the Dynamo/AOT path, no C++ build
        torch.manual_seed(0)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        t_init = time.perf_counter()
        model = build_gpt(cfg, init_device=device)  # on the device: no 1.3B CPU init and copy
        model.attention, model.loss_mode = attention, loss_mode
        if compiled:
            compile_blocks(model, backend=backend)
        opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-4, betas=(0.9, 0.95),
                                **({"fused": True} if adamw == "fused" else {"foreach": True}))
        init_s = time.perf_counter() - t_init
        autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda"
                    else contextlib.nullcontext())
        valid = (labels != IGNORE_INDEX).sum()

        def step():
            with autocast:
                if loss_mode == "chunked":
                    loss = model(ids, pos, seg, labels).sum() / valid
                else:
                    loss = plain_loss_sum(model(ids, pos, seg), labels) / valid
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()

        row = results[name] = {"status": "running", "attention": attention, "compile_per_block": compiled,
                               "compile_backend": backend if compiled else None, "loss": loss_mode,
                               "adamw": adamw, "fused_adamw": bool(opt.defaults.get("fused")), "init_s": init_s}
        t0 = time.perf_counter()
        row["first_step_loss"] = float(step())  # includes compilation
        _sync(device)
        row["first_step_s (incl. compile)"] = time.perf_counter() - t0
        record(out)
        if time.monotonic() > deadline - 3:
            row["status"] = "partial"
            row["reason"] = "section time spent after the first step"
            del model, opt
            continue
        step()  # second step: a compiled backward/optimizer may still warm up
        _sync(device)
        t0 = time.perf_counter()
        done = 0
        for _ in range(steps):
            step()
            done += 1
            if time.monotonic() > deadline - 2:
                break
        _sync(device)  # the queued work belongs to the measurement
        wall = time.perf_counter() - t0
        tok_s = batch * t * done / wall
        tflops = tok_s * cfg.flops_per_token() / 1e12
        row.update({
            "status": "ok", "timed_steps": done, "step_s": wall / done, "tokens_per_s": tok_s, "tflops": tflops,
            "mfu": tflops / peak if peak else None,
            "hfu_estimate": (tok_s * hw_flops / 1e12 / peak) if peak else None,
            "peak_memory_gib": (torch.cuda.max_memory_allocated(device) / 2**30) if device.type == "cuda" else None,
        })
        record(out)
        del model, opt
    ok = [r for r in results.values() if r.get("first_step_loss") is not None]
    losses = [r["first_step_loss"] for r in ok]
    out["first_step_losses_agree"] = (max(losses) - min(losses) <= 2e-2 * abs(losses[0])) if losses else None
    if results.get("before", {}).get("status") == "ok" and results.get("after", {}).get("status") == "ok":
        out["speedup_after_vs_before"] = results["after"]["tokens_per_s"] / results["before"]["tokens_per_s"]
    return out


def versions_line(device) -> str:
    import platform

    import torch
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return (f"torch {torch.__version__} | CUDA {torch.version.cuda} | Python {platform.python_version()} | "
            f"device {name}")


def section_versions(args, device, deadline, record):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from trainer.attention import dense_mask
    from trainer.metrics import peak_tflops
    out = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "peak_tflops_bf16": peak_tflops(device)}
    import importlib.util
    out["modules"] = {m: importlib.util.find_spec(m) is not None for m in ("numpy", "google_crc32c", "psutil")}
    from model_contract import crc32c
    out["crc32c"] = crc32c.IMPLEMENTATION  # which of model_contract/crc32c.py's implementations reads the shards
    from trainer.attention import varlen_attention_op
    out["varlen_op"] = varlen_attention_op() is not None
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    b, h, t, d = (2, 4, 256, 64) if not args.tiny else (1, 2, 32, 16)
    q, k, v = (torch.randn(b, h, t, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    mask = dense_mask(_doc_segments(b, t, t // 4, seed=2).to(device))
    accepts = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward()
            accepts[backend.name] = True
        except Exception as e:  # noqa: BLE001 - the point is to record which refuse, and why
            accepts[backend.name] = f"no: {str(e).splitlines()[0][:120]}"
    out["sdpa_backends_with_dense_mask"] = accepts
    return out


def section_attention(args, device, deadline, record):
    import torch
    from trainer.attention import attend, build_mask, varlen_run_bound
    b, h, t, d = (8, 16, 2048, 128) if not args.tiny else (2, 2, 64, 16)
    mixes = {"short docs (mean 300)": 300, "long docs (mean 1500)": 1500} if not args.tiny else \
        {"short docs (mean 8)": 8, "long docs (mean 40)": 40}
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    from trainer.attention import varlen_attention_op
    # varlen is FlashAttention's (CUDA only, torch with torch.nn.attention.varlen): elsewhere its rows say why
    no_varlen = ("needs a CUDA device" if device.type != "cuda" else
                 None if varlen_attention_op() is not None else "this torch has no torch.nn.attention.varlen")
    impls = ["sdpa", "flex"] + ([] if no_varlen else ["varlen"])
    if no_varlen:
        print(f"[attention] varlen skipped: {no_varlen}", flush=True)
    out = {"shape": {"B": b, "H": h, "T": t, "D": d}, "mixes": {}}
    for mix, mean in mixes.items():
        seg_host = _doc_segments(b, t, mean, seed=3)
        seg = seg_host.to(device)
        starts = (seg[:, 1:] != seg[:, :-1]).sum().item() + b
        bound = varlen_run_bound(seg_host)  # as the trainer sizes it (trainer/train.py _bound_varlen)
        row = {"documents": starts, "varlen_sequences": bound, "varlen_sequences_unbounded": b * t}
        if no_varlen:
            row["varlen"] = {"status": "skipped", "reason": no_varlen}
        for impl in impls:
            if time.monotonic() > deadline - 3:
                row[impl] = {"status": "skipped"}
                continue
            backward = not (impl == "flex" and device.type == "cpu")  # CPU flex: forward only
            q, k, v = (torch.randn(b, h, t, d, device=device, dtype=dtype, requires_grad=backward)
                       for _ in range(3))

            def run():
                mask = build_mask(seg, impl, bound)  # once per micro-batch, as in training
                o = attend(q, k, v, mask)
                if backward:
                    o.sum().backward()
                return o
            try:
                run()
                _sync(device)
                reps = 5 if device.type == "cuda" else 2
                t0 = time.perf_counter()
                for _ in range(reps):
                    run()
                _sync(device)
                row[impl] = {"status": "ok", "ms": 1e3 * (time.perf_counter() - t0) / reps,
                             "backward": backward}
            except Exception as e:  # noqa: BLE001 - a kernel that fails on this device is a result
                row[impl] = {"status": "error", "error": str(e).splitlines()[0][:200]}
        ref = row.get("sdpa", {}).get("ms")
        for impl in impls:
            if ref and row.get(impl, {}).get("ms"):
                row[impl]["speedup_vs_dense"] = ref / row[impl]["ms"]
        out["mixes"][mix] = row
        record(out)
    return out


def _dataset(args, seq_len: int, vocab: int) -> str:
    path = os.path.join(args.out, "data")
    if not os.path.exists(os.path.join(path, "manifest.json")):
        from tests.trainer_fixtures import write_dataset
        n_docs = 400 if args.tiny else 3000
        write_dataset(path, seq_len=seq_len, vocab=vocab, n_docs=n_docs, n_shards=4 if args.tiny else 8,
                      min_len=5 if args.tiny else 200, max_len=60 if args.tiny else 4000)
    return path


def section_loader(args, device, deadline, record):
    from model_contract import load_manifest, manifest_path
    from trainer.config import DataConfig
    from trainer.data import ShardLoader
    seq_len, vocab = (32, 64) if args.tiny else (2048, 50304)
    path = _dataset(args, seq_len, vocab)
    mfile = manifest_path(path)
    manifest = load_manifest(mfile)
    gb = 8 if args.tiny else 32
    loader = ShardLoader(manifest, mfile, DataConfig(path=path, streams=4 if args.tiny else 8,
                                                     shuffle_buffer=16 if args.tiny else 256), seq_len, gb)
    next(loader)  # warm-up: opening shards, filling shuffle buffers
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < (1.0 if args.tiny else 10.0) and time.monotonic() < deadline - 2:
        next(loader)
        n += 1
    dt = time.perf_counter() - t0
    if hasattr(loader, "close"):
        loader.close()
    return {"global_batch": gb, "seq_len": seq_len, "batches": n, "tokens_per_s": n * gb * seq_len / dt}


def section_cli(args, device, deadline, record):
    seq_len, vocab = (32, 64) if args.tiny else (2048, 50304)
    path = _dataset(args, seq_len, vocab)
    ck = os.path.join(args.out, "cli-checkpoints")
    if args.tiny:
        model = ["--model", "tiny", "--seq-len", "32", "--vocab-size", "64", "--n-layers", "2", "--d-model", "32",
                 "--n-heads", "2", "--data-streams", "4", "--shuffle-buffer", "16", "--global-batch", "8",
                 "--threads", "1", "--device", "cpu"]
        first, total = 4, 6
    else:
        model = ["--model", "125M", "--global-batch", "16", "--device", "cuda", "--compile"]
        first, total = 30, 40
    common = [sys.executable, "-m", "trainer.train", "--data", path, *model, "--steps", str(total),
              "--checkpoint-dir", ck, "--log-every", "5", "--warmup-steps", "2"]
    env = dict(os.environ, PYTHONPATH=with_repo_path(os.environ.get("PYTHONPATH")), OMP_WAIT_POLICY="PASSIVE")
    out = {}
    t0 = time.perf_counter()
    p = subprocess.run(common + ["--stop-at-step", str(first)], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=max(5, deadline - time.monotonic()))
    out["first_run_s"] = time.perf_counter() - t0
    if p.returncode:
        raise RuntimeError(f"first run failed: {p.stderr[-800:]}")
    out["first_run_last_line"] = p.stdout.strip().splitlines()[-1]  # the checkpoint and the resume command
    record(out)
    t0 = time.perf_counter()
    p = subprocess.run(common, cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=max(5, deadline - time.monotonic()))
    out["resume_run_s"] = time.perf_counter() - t0
    if p.returncode:
        raise RuntimeError(f"resumed run failed: {p.stderr[-800:]}")
    out["resumed"] = "resumed from" in p.stdout
    out["steps"] = [first, total]
    out["last_lines"] = p.stdout.strip().splitlines()[-2:]
    if not out["resumed"]:
        raise RuntimeError("the second run did not resume from the checkpoint")
    return out


FUNCS = {"step": section_step, "versions": section_versions, "attention": section_attention,
         "loader": section_loader, "cli": section_cli}


def _write(path: str, report: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1, default=str)
    os.replace(tmp, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="/tmp/gpu_check")
    p.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CPU test)")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--limit-scale", type=float, default=1.0, help="multiply every section's time limit")
    p.add_argument("--force", action="store_true", help="rerun sections that already finished")
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    path = os.path.join(a.out, "gpu_check.json")
    report = json.load(open(path)) if os.path.exists(path) else {}
    device = _device(a)
    print(versions_line(device), flush=True)  # first: what this machine runs, before anything can fail
    print(crc32c_line(), flush=True)
    for name in SECTIONS:
        if name not in a.sections:
            continue
        if report.get(name, {}).get("status") == "ok" and not a.force:
            print(f"[{name}] done in an earlier run: skipped", flush=True)
            continue
        limit = LIMITS[name] * a.limit_scale
        t0 = time.monotonic()
        partial: dict = {}

        def record(result, name=name, t0=t0, partial=partial):
            """Save what the section has so far: a later timeout or error keeps it."""
            partial["result"] = result
            report[name] = {"status": "running", "seconds": time.monotonic() - t0, "result": result}
            _write(path, report)

        try:
            with time_limit(limit):
                result = FUNCS[name](a, device, t0 + limit, record)
            report[name] = {"status": "ok", "seconds": time.monotonic() - t0, "result": result}
        except SectionTimeout as e:
            report[name] = {"status": "timeout", "seconds": time.monotonic() - t0, "error": str(e)}
        except Exception as e:  # noqa: BLE001 - one failing section must not lose the others
            report[name] = {"status": "error", "seconds": time.monotonic() - t0,
                            "error": f"{type(e).__name__}: {str(e)[-1500:]}"}
        if report[name]["status"] != "ok" and "result" in partial:
            report[name]["result"] = partial["result"]  # e.g. "before" survives a timeout in "after"
        _write(path, report)
        print(f"[{name}] {report[name]['status']} in {report[name]['seconds']:.1f} s", flush=True)
    print(json.dumps(report, indent=1, default=str))
    return 0 if all(report.get(s, {}).get("status") == "ok" for s in a.sections) else 1


if __name__ == "__main__":
    sys.exit(main())
