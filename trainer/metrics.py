"""Per-interval training metrics: loss, tokens/s, TFLOP/s, MFU, peak memory, and where input time goes.

Input time is split three ways: `read` (file I/O, TFRecord framing and CRC), `decode` (protobuf parsing,
batching, label construction) and `h2d` (host-to-device copy). When their share of the step time passes
`input_bound_share`, a warning names the largest part and the knob that helps.
"""
from __future__ import annotations

import json
import resource
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

# Dense bf16 peak per device, TFLOP/s (no sparsity), matched against torch.cuda.get_device_name in order: the
# first pattern found in the name wins, so the PCIe / NVL parts come before the plain "H100" (SXM) entry.
# CPU or an unknown device: none (MFU is not reported rather than guessed).
PEAK_TFLOPS = (
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM5 ("NVIDIA H100 80GB HBM3")
    ("H800", 989.0),
    ("A100", 312.0),  # SXM4 and PCIe have the same tensor-core peak
    ("A800", 312.0),
    ("L40S", 362.0),
    ("A10G", 70.0),
    ("L4", 121.0),
)

_ADVICE = {
    "read": "reading shards is slow: put the dataset on local NVMe/FSx or raise storage throughput",
    "decode": "protobuf decoding is slow: give the loader more CPU (fewer ranks per host) or larger examples",
    "h2d": "host-to-device copies are slow: pin memory / check the PCIe topology",
}


def peak_tflops(device: torch.device) -> Optional[float]:
    if device.type != "cuda":
        return None
    return peak_tflops_for_name(torch.cuda.get_device_name(device))


def peak_tflops_for_name(name: str) -> Optional[float]:
    for key, value in PEAK_TFLOPS:
        if key in name:
            return value
    return None


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


@dataclass
class Interval:
    steps: int = 0
    step_seconds: float = 0.0
    read: float = 0.0
    decode: float = 0.0
    h2d: float = 0.0
    tokens: int = 0  # tokens processed (all positions) over all ranks
    loss_sum: float = 0.0


@dataclass
class MetricsLogger:
    flops_per_token: float
    world: int
    device: torch.device
    path: Optional[str] = None
    is_writer: bool = True  # rank 0 writes
    input_bound_share: float = 0.10
    cur: Interval = field(default_factory=Interval)
    history: list = field(default_factory=list)

    def __post_init__(self):
        self._peak = peak_tflops(self.device)
        self._file = open(self.path, "a") if (self.path and self.is_writer) else None
        self._t_start = time.perf_counter()

    def record_step(self, *, loss, step_seconds: float, read: float, decode: float, h2d: float,
                    tokens: int) -> None:
        c = self.cur
        c.steps += 1
        c.step_seconds += step_seconds
        c.read += read
        c.decode += decode
        c.h2d += h2d
        c.tokens += tokens
        # A device tensor stays on the device (no host sync per step); it is read once, at flush.
        c.loss_sum = c.loss_sum + (loss.detach() if isinstance(loss, torch.Tensor) else loss)

    def flush(self, step: int, lr: float, grad_norm: float, extra: Optional[dict] = None) -> Optional[dict]:
        c = self.cur
        if c.steps == 0:
            return None
        tok_s = c.tokens / c.step_seconds
        tflops = tok_s * self.flops_per_token / self.world / 1e12  # per device
        wait = c.read + c.decode + c.h2d
        rec = {
            "step": step, "loss": float(c.loss_sum) / c.steps, "lr": lr, "grad_norm": float(grad_norm),
            "tokens_per_s": tok_s, "tflops_per_device": tflops,
            "mfu": (tflops / self._peak) if self._peak else None,
            "peak_memory_bytes": peak_memory_bytes(self.device),
            "step_seconds": c.step_seconds / c.steps,
            "data_wait_share": wait / c.step_seconds,
            "data_wait": {k: getattr(c, k) / c.step_seconds for k in ("read", "decode", "h2d")},
            "input_bound": wait / c.step_seconds > self.input_bound_share,
            "elapsed_s": time.perf_counter() - self._t_start,
        }
        if extra:
            rec.update(extra)
        if rec["input_bound"]:
            cause = max(("read", "decode", "h2d"), key=lambda k: getattr(c, k))
            rec["warning"] = (f"input-bound: {100 * rec['data_wait_share']:.0f}% of step time waiting for data, "
                              f"mostly {cause} ({100 * rec['data_wait'][cause]:.0f}%): {_ADVICE[cause]}")
        self.history.append(rec)
        if self.is_writer:
            if self._file:
                self._file.write(json.dumps(rec) + "\n")
                self._file.flush()
            print(self.format(rec), flush=True)
            if "warning" in rec:
                print(f"WARNING {rec['warning']}", flush=True)
        self.cur = Interval()
        return rec

    @staticmethod
    def format(rec: dict) -> str:
        mfu = f"{100 * rec['mfu']:.1f}%" if rec["mfu"] is not None else "n/a"
        w = rec["data_wait"]
        return (f"step {rec['step']:>6} | loss {rec['loss']:.4f} | {rec['tokens_per_s']:,.0f} tok/s | "
                f"{rec['tflops_per_device']:.3f} TFLOP/s/dev | MFU {mfu} | "
                f"mem {rec['peak_memory_bytes'] / 2**30:.2f} GiB | data wait {100 * rec['data_wait_share']:.1f}% "
                f"(read {100 * w['read']:.1f} / decode {100 * w['decode']:.1f} / h2d {100 * w['h2d']:.1f})")

    def close(self) -> None:
        if self._file:
            self._file.close()
