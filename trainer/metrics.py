"""Per-interval training metrics: loss, tokens/s, TFLOP/s, MFU, peak memory, and where input time goes.

Timing cannot flatter: the rates of an interval are its tokens divided by its *wall* time, read after the
device has finished the interval's work (`torch.cuda.synchronize` at each flush, so GPU work still queued at the
last step's return is counted in the interval it belongs to). Per-step host times are not summed: on CUDA a step
returns as soon as its kernels are queued. Checkpoint saves are excluded (`exclude`); they report their own time.

Input time is split three ways: `read` (file I/O, TFRecord framing and CRC), `decode` (protobuf parsing,
batching, label construction) and `h2d` (host-to-device copy, timed with CUDA events on the device: the copy is
non-blocking, so host time would only measure its enqueue). When their share of the interval passes
`input_bound_share`, a warning names the largest part and the knob that helps.

MFU follows the PaLM / Megatron convention: model FLOPs per token = 6N + 12·L·d·T (N matmul weights, full T×T
attention) over the device's dense bf16 peak. With document masking the attention actually executed is smaller
and activation checkpointing recomputes a forward; `hardware_flops_per_token` estimates that executed work
(the "HFU" beside MFU).
"""
from __future__ import annotations

import json
import resource
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

if TYPE_CHECKING:
    from trainer.grad_sync import GradSyncTiming

FLOP_CONVENTION = "6N+12LdT"

# Dense bf16 peak per device, TFLOP/s (no sparsity). Exact torch.cuda.get_device_name strings first; then
# substrings, in order (the first found wins: the PCIe / NVL parts before the plain SXM names). CPU or an
# unknown device: none (MFU is not reported rather than guessed).
PEAK_TFLOPS_EXACT = {
    "NVIDIA H200 NVL": 835.0,
    "NVIDIA H200": 989.0,
    "NVIDIA GH200 480GB": 989.0,
    "NVIDIA H100 80GB HBM3": 989.0,  # SXM5
    "NVIDIA H100 PCIe": 756.0,
    "NVIDIA H100 NVL": 835.0,
    "NVIDIA A100-SXM4-40GB": 312.0,
    "NVIDIA A100-SXM4-80GB": 312.0,
    "NVIDIA A100-PCIE-40GB": 312.0,
    "NVIDIA A100 80GB PCIe": 312.0,
}
PEAK_TFLOPS = (
    ("H200 NVL", 835.0),
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM5 ("NVIDIA H100 80GB HBM3")
    ("H800", 989.0),
    ("A100", 312.0),  # SXM4 and PCIe, 40 and 80 GB: the same tensor-core peak
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
    name = name.strip()
    if name in PEAK_TFLOPS_EXACT:
        return PEAK_TFLOPS_EXACT[name]
    for key, value in PEAK_TFLOPS:
        if key in name:
            return value
    return None


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def attended_keys_per_token(segment_ids) -> float:
    """Mean number of keys a query attends to under the causal document mask: a document of n tokens costs
    n (n + 1) / 2 query-key pairs (padding, segment 0, counts as one document). Pure host arithmetic on the
    loader's CPU batch (no device sync)."""
    seg = torch.as_tensor(segment_ids).reshape(-1, torch.as_tensor(segment_ids).shape[-1])
    b, t = seg.shape
    starts = torch.ones(b, t, dtype=torch.bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    idx = torch.nonzero(starts.reshape(-1)).reshape(-1)
    lengths = torch.diff(torch.cat([idx, torch.tensor([b * t])])).double()
    return float((lengths * (lengths + 1) / 2).sum() / (b * t))


def hardware_flops_per_token(model_cfg, attended_keys: float, ac: str = "none") -> float:
    """Executed training FLOPs per token (estimate): the matmuls of 6N, attention over the keys actually
    attended (2·2·d per key forward, x3 with backward) instead of the convention's T, and one more forward of
    every block under full activation checkpointing (selective recomputes only element-wise ops)."""
    d, f, layers = model_cfg.d_model, model_cfg.d_ff, model_cfg.n_layers
    block_fwd = 2 * (4 * d * d + 2 * d * f) + 4 * attended_keys * d
    recompute = 1.0 if ac == "full" else 0.0
    return layers * block_fwd * (3 + recompute) + model_cfg.head_flops_per_token()


def interval_rates(tokens: int, steps: int, wall: float, flops_per_token: float, world: int,
                   peak: Optional[float], hw_flops_per_token: Optional[float] = None) -> dict:
    """The interval's figures from its wall time alone: tokens/s = tokens / wall, step time = wall / steps,
    TFLOP/s per device and MFU (and HFU with the executed-work estimate) against `peak` TFLOP/s."""
    wall = max(wall, 1e-9)
    tok_s = tokens / wall
    tflops = tok_s * flops_per_token / world / 1e12
    hw = tok_s * hw_flops_per_token / world / 1e12 if hw_flops_per_token else None
    return {"tokens_per_s": tok_s, "step_seconds": wall / max(steps, 1), "tflops_per_device": tflops,
            "mfu": tflops / peak if peak else None,
            "hfu": (hw / peak) if (peak and hw is not None) else None}


class DeviceTimer:
    """Seconds of a section summed over an interval: CUDA event pairs (device time, read after the flush's
    synchronize) and host seconds (CPU, where the copy is synchronous)."""

    def __init__(self):
        self.pairs: list = []
        self.host = 0.0

    def add(self, host_seconds: float, events: Optional[tuple] = None) -> None:
        if events is not None:
            self.pairs.append(events)
        else:
            self.host += host_seconds

    def total(self) -> float:
        """Call after the device is synchronised."""
        return self.host + sum(a.elapsed_time(b) for a, b in self.pairs) / 1e3


@dataclass
class Interval:
    steps: int = 0
    host_seconds: float = 0.0  # per-step host time (diagnostic only: rates use the interval's wall)
    read: float = 0.0
    decode: float = 0.0
    tokens: int = 0  # tokens processed (all positions) over all ranks
    attended: float = 0.0  # sum over steps of the mean attended keys per token
    loss_sum: float = 0.0
    grad_sync: list[GradSyncTiming] = field(default_factory=list)  # one per step (trainer/grad_sync.py)


@dataclass
class MetricsLogger:
    flops_per_token: float
    world: int
    device: torch.device
    path: Optional[str] = None
    is_writer: bool = True  # rank 0 writes
    input_bound_share: float = 0.10
    total_steps: int = 0  # for "step s/total" and the ETA
    model_cfg: object = None  # a ModelConfig: the executed-work (HFU) estimate
    ac: str = "none"
    clock: Callable[[], float] = time.perf_counter
    cur: Interval = field(default_factory=Interval)
    history: list[dict[str, Any]] = field(default_factory=list)  # the JSON records `flush` writes, one per interval

    def __post_init__(self):
        self._peak = peak_tflops(self.device)
        self._file = open(self.path, "a") if (self.path and self.is_writer) else None
        self._t_start = self.clock()
        self._t_interval = self._t_start
        self._excluded = 0.0
        self._steps_run = 0
        self._run_seconds = 0.0  # wall of the steps run by this process (the ETA's rate)
        self.h2d = DeviceTimer()

    def exclude(self, seconds: float) -> None:
        """Wall time inside the interval that is not training (a checkpoint save)."""
        self._excluded += seconds

    def record_step(self, *, loss, read: float, decode: float, tokens: int, step_seconds: float = 0.0,
                    h2d: float = 0.0, h2d_events: Optional[tuple] = None, segment_ids=None,
                    grad_sync=None) -> None:
        c = self.cur
        c.steps += 1
        c.host_seconds += step_seconds
        c.read += read
        c.decode += decode
        self.h2d.add(h2d, h2d_events)
        c.tokens += tokens
        if segment_ids is not None:
            c.attended += attended_keys_per_token(segment_ids)
        if grad_sync is not None:
            c.grad_sync.append(grad_sync)
        # A device tensor stays on the device (no host sync per step); it is read once, at flush.
        c.loss_sum = c.loss_sum + (loss.detach() if isinstance(loss, torch.Tensor) else loss)

    def flush(self, step: int, lr: float, grad_norm: float, extra: Optional[dict] = None) -> Optional[dict]:
        c = self.cur
        if c.steps == 0:
            return None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the interval's queued work belongs to the interval
        now = self.clock()
        wall = max(now - self._t_interval - self._excluded, 1e-9)
        loss, norm = float(c.loss_sum) / c.steps, float(grad_norm)
        h2d = self.h2d.total()
        hw = None
        if self.model_cfg is not None and c.attended:
            hw = hardware_flops_per_token(self.model_cfg, c.attended / c.steps, self.ac)
        rates = interval_rates(c.tokens, c.steps, wall, self.flops_per_token, self.world, self._peak, hw)
        self._steps_run += c.steps
        self._run_seconds += wall
        wait = c.read + c.decode + h2d
        rec = {
            "step": step, "total_steps": self.total_steps, "loss": loss, "lr": lr, "grad_norm": norm,
            **rates, "flop_convention": FLOP_CONVENTION, "peak_tflops": self._peak,
            "peak_memory_bytes": peak_memory_bytes(self.device),
            "interval_seconds": wall, "interval_steps": c.steps,
            "data_wait_share": wait / wall,
            "data_wait": {"read": c.read / wall, "decode": c.decode / wall, "h2d": h2d / wall},
            "input_bound": wait / wall > self.input_bound_share,
            "elapsed_s": now - self._t_start,
            "eta_s": eta_seconds(step, self.total_steps, self._steps_run, self._run_seconds),
        }
        if c.grad_sync:
            rec["grad_sync"] = grad_sync_summary(c.grad_sync)
        if extra:
            rec.update(extra)
        if rec["input_bound"]:
            parts = {"read": c.read, "decode": c.decode, "h2d": h2d}
            cause = max(parts, key=parts.get)
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
        self.h2d = DeviceTimer()
        self._t_interval, self._excluded = self.clock(), 0.0
        return rec

    @staticmethod
    def format(rec: dict) -> str:
        from trainer.progress import format_progress  # noqa: PLC0415
        return format_progress(rec)

    def close(self) -> None:
        if self._file:
            self._file.close()


def grad_sync_summary(timings: list) -> dict:
    """The interval's gradient communication (rank 0's host clock, trainer/grad_sync.py): buckets per step, the
    share of them started before the backward returned, the mean lead of the first launch over the backward's
    end (> 0: overlapped), and the mean wait for gradients after the backward (the part not hidden)."""
    n = len(timings)
    buckets = sum(t.buckets for t in timings)
    leads = [t.lead_s for t in timings if t.lead_s is not None]
    return {"mode": timings[-1].mode, "buckets_per_step": buckets / n,
            "in_backward_share": (sum(t.in_backward for t in timings) / buckets) if buckets else 0.0,
            "first_launch_lead_s": (sum(leads) / len(leads)) if leads else None,
            "exposed_s": sum(t.exposed_s for t in timings) / n}


def eta_seconds(step: int, total: int, steps_run: int, run_seconds: float) -> Optional[float]:
    """Remaining steps at the mean wall per step of the steps this process ran (None before any)."""
    if not total or steps_run <= 0:
        return None
    return max(0, total - step) * run_seconds / steps_run
