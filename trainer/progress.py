"""What a person watching a training run reads: one progress line per logging interval, and a last line that
says where the checkpoint is and the exact command that resumes from it. Pure formatting (trainer/metrics.py
computes the figures; trainer/train.py prints the last line)."""
from __future__ import annotations

import os
import shlex
import sys
from typing import Mapping, Optional, Sequence


def duration(seconds: Optional[float]) -> str:
    """1h02m03s / 4m05s / 6.1s; '?' when unknown."""
    if seconds is None:
        return "?"
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s"


def format_progress(rec: dict) -> str:
    """step s/total | loss | lr | grad norm | tokens/s | MFU (convention, peak) and the executed-work HFU |
    memory | data wait | elapsed | ETA."""
    total = rec.get("total_steps") or 0
    step = f"{rec['step']:>6}/{total}" if total else f"{rec['step']:>6}"
    if rec.get("mfu") is not None:
        mfu = f"MFU {100 * rec['mfu']:.1f}% ({rec.get('flop_convention', '6N+12LdT')} vs {rec['peak_tflops']:.0f} TFLOP/s)"
        if rec.get("hfu") is not None:
            mfu += f" | HFU est {100 * rec['hfu']:.1f}%"
    else:
        mfu = "MFU n/a (no known peak for this device)"
    w = rec["data_wait"]
    return (f"step {step} | loss {rec['loss']:.4f} | lr {rec['lr']:.2e} | grad norm {rec['grad_norm']:.3f} | "
            f"{rec['tokens_per_s']:,.0f} tok/s | {rec['tflops_per_device']:.3f} TFLOP/s/dev | {mfu} | "
            f"mem {rec['peak_memory_bytes'] / 2**30:.2f} GiB | data wait {100 * rec['data_wait_share']:.1f}% "
            f"(read {100 * w['read']:.1f} / decode {100 * w['decode']:.1f} / h2d {100 * w['h2d']:.1f}) | "
            f"{grad_sync_part(rec.get('grad_sync'))}"
            f"elapsed {duration(rec.get('elapsed_s'))} | ETA {duration(rec.get('eta_s'))}")


def grad_sync_part(g: Optional[dict]) -> str:
    """'dp all-reduce (hooks): 4/4 buckets in backward, first 12.3ms before its end, 0.4ms exposed | ' (trainer/
    metrics.py grad_sync_summary); empty without dp communication."""
    if not g:
        return ""
    lead = g.get("first_launch_lead_s")
    when = "?" if lead is None else (f"{1e3 * lead:.1f}ms before its end" if lead > 0
                                     else f"{-1e3 * lead:.1f}ms after it")
    n = g["buckets_per_step"]
    return (f"dp all-reduce ({g['mode']}): {g['in_backward_share'] * n:.0f}/{n:.0f} buckets in backward, first "
            f"{when}, {1e3 * g['exposed_s']:.1f}ms exposed | ")


# Flags that must not be repeated by a resume: it should continue, not start over or stop at the same step.
_DROP_FLAGS = {"--no-resume": 0, "--stop-at-step": 1, "--check-only": 0}


def resume_argv(argv: Sequence[str]) -> list:
    """The trainer's own arguments for a resume: the same run, minus --no-resume / --stop-at-step."""
    out, skip = [], 0
    for a in argv:
        if skip:
            skip -= 1
            continue
        name = a.split("=", 1)[0]
        if name in _DROP_FLAGS:
            skip = 0 if "=" in a else _DROP_FLAGS[name]
            continue
        out.append(a)
    return out


def resume_command(argv: Sequence[str], module: str, environ: Mapping[str, str] = os.environ,
                   cwd: Optional[str] = None) -> str:
    """The exact command that continues this run, from the directory it ran in (its paths may be relative):
    torchrun with this node's process count (and the node count for a multi-node run) when torchrun started
    it, else plain python."""
    args = (["-m", module] if module else [sys.argv[0]]) + resume_argv(argv)
    cd = f"cd {shlex.quote(cwd or os.getcwd())} && "
    if "TORCHELASTIC_RUN_ID" not in environ:
        return cd + shlex.join([sys.executable] + args)
    world = int(environ.get("WORLD_SIZE", "1"))
    local = int(environ.get("LOCAL_WORLD_SIZE", str(world)))
    nodes = max(1, world // max(local, 1))
    launcher = ["torchrun", "--standalone"] if nodes == 1 else ["torchrun", "--nnodes", str(nodes)]
    cmd = launcher + ["--nproc-per-node", str(local)] + args
    suffix = "" if nodes == 1 else "  (on every node, with this job's rendezvous options)"
    return cd + shlex.join(cmd) + suffix


def final_line(step: int, total: int, checkpoint: Optional[str], command: str) -> str:
    """The run's last line: where it stopped, where its checkpoint is, and how to continue."""
    state = f"finished {step}/{total} steps" if step >= total else f"stopped at step {step}/{total}"
    if not checkpoint:
        return f"{state}; no checkpoint was written (give --checkpoint-dir to be able to resume)"
    more = (" (it has reached --steps: raise --steps to train further)" if step >= total else "")
    return f"{state}; checkpoint {checkpoint}; resume with: {command}{more}"
