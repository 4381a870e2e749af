"""The dry run's calibration (pipeline/tools/dry_run.py): the shard job itself, run in this process on a slice of
the sample, beside the stage model's estimate for the same slice.

The stage timings (pipeline/tools/dry_run_sample.py) miss what the job adds around them (document ids,
statistics, spill writes, hashing, the runner's per-element cost), so the job runs on a slice of the sample
(CALIBRATION_BYTES of raw lines from the sampled files, recompressed as they were) and on its half; what the job's
marginal CPU per byte between the two exceeds the model's on that same slice is added to the estimate, times the
input's raw bytes, with the CPU a run spends above a one-record run (`Calibration`).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable, Optional

from pipeline.config import ShardConfig
from transforms.io.read_records import compression_of

# Raw JSON lines (in all) the job itself runs on to calibrate the stage model. The job's marginal CPU per byte is
# the difference of two runs (the slice and its half) that each carry the job's fixed cost, so the slice must
# be large beside that, and the measured ratio is noisy under load (docs/BENCHMARKS.md, "Dry run calibration"):
# the estimate adds the difference rather than multiplying by the ratio (`Calibration.extra_cpu_per_byte`).
CALIBRATION_BYTES = 16 << 20
CALIBRATION_REPEATS = 3  # runs of the slice and of its half; each size's least CPU counts (load only adds to it)


@dataclass(frozen=True)
class Calibration:
    """The job run on a slice of the sample and on its first half: its marginal CPU per raw byte beside the stage
    model's for the same slice, and the CPU a run spends above a one-record run whatever its size (shards,
    units, planning: `overhead_cpu_s`) and the one-record run's own (`one_record_cpu_s`, the first job run in
    this process: lazy imports, planning, graph, runner, commit)."""
    raw_bytes: int
    job_cpu_per_byte: float
    model_cpu_per_byte: float
    overhead_cpu_s: float
    one_record_cpu_s: float = 0.0

    @property
    def factor(self) -> float:
        """The job's CPU per byte over the model's on the slice (shown in the note; the estimate adds the
        difference, `extra_cpu_per_byte`)."""
        if self.model_cpu_per_byte > 0 and self.job_cpu_per_byte > 0:
            return self.job_cpu_per_byte / self.model_cpu_per_byte
        return 1.0

    @property
    def extra_cpu_per_byte(self) -> float:
        """What the job spends per raw byte around the modelled stages (document ids, statistics, spill, hashing,
        the runner's per-element cost). Added, not multiplied: that work does not depend on how fast the
        tokenizer is, and the slice (the first lines of each sampled file) tokenizes at another rate than the
        whole input; adding measured closer to the real runs than scaling (docs/BENCHMARKS.md, "Dry run
        calibration"). Never below 0: the job runs every stage the model times, so a lower job rate is timing
        noise."""
        return max(0.0, self.job_cpu_per_byte - self.model_cpu_per_byte)


def process_cpu_s() -> float:
    import resource  # noqa: PLC0415

    r = resource.getrusage(resource.RUSAGE_SELF)  # the in-memory runner's workers are threads of this process
    return r.ru_utime + r.ru_stime


_IN_PROCESS = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


def write_slices(slices: list, directory: str) -> list:
    """The calibration input: each sampled file's slice of raw lines, compressed as the file was."""
    import gzip  # noqa: PLC0415

    import zstandard  # noqa: PLC0415

    paths = []
    for i, (path, lines) in enumerate(slices):
        body = b"".join(line + b"\n" for line in lines)
        kind = compression_of(path)
        suffix = {"zstd": ".jsonl.zst", "gzip": ".jsonl.gz"}.get(kind, ".jsonl")
        data = zstandard.ZstdCompressor(level=3).compress(body) if kind == "zstd" else (
            gzip.compress(body, compresslevel=6) if kind == "gzip" else body)
        out = os.path.join(directory, f"slice-{i:03d}{suffix}")
        with open(out, "wb") as f:
            f.write(data)
        paths.append(out)
    return paths


def calibrate(config: ShardConfig, slices: list, model_core_s: Callable) -> Optional[Calibration]:
    """Run the job in this process on one record of `slices`, then CALIBRATION_REPEATS times on their first
    halves and on them whole, in a temporary directory this function creates and removes; the stage model's
    estimate for the same slice beside it: `model_core_s(config, beam_args, sample_files)`, its core seconds
    (pipeline/tools/dry_run.py passes its uncalibrated estimate, which this module need not import)."""
    import dataclasses  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    from pipeline.shard import shard_pipeline  # noqa: PLC0415

    if not slices:
        return None
    root = tempfile.mkdtemp(prefix="pileprep-dry-run-")
    try:
        os.mkdir(os.path.join(root, "in"))
        os.mkdir(os.path.join(root, "one"))
        paths = write_slices(slices, os.path.join(root, "in"))
        write_slices([(slices[0][0], slices[0][1][:1])], os.path.join(root, "one"))
        # a fixed shard count (so the size option goes back to its default: giving both is refused) and no
        # unknown-source refusal on a slice (allowed only with weights: pipeline/enabling_flags.py)
        base = dict(val_inputs=(), test_inputs=(), staging_dir=None, num_shards=config.num_shards or 1,
                    allow_unknown_sources=bool(config.source_weights),
                    target_shard_mb=type(config).__dataclass_fields__["target_shard_mb"].default)
        one = dataclasses.replace(config, inputs=(os.path.join(root, "one", "*"),), output=os.path.join(
            root, "one-out"), **{**base, "source_weights": "", "allow_unknown_sources": False})
        full = dataclasses.replace(config, inputs=(os.path.join(root, "in", "*"),), output=os.path.join(root, "out"),
                                   **base)
        half = dataclasses.replace(full, inputs=(os.path.join(root, "half", "*"),),
                                   output=os.path.join(root, "half-out"))
        os.mkdir(os.path.join(root, "half"))
        write_slices([(p, lines[:max(1, len(lines) // 2)]) for p, lines in slices], os.path.join(root, "half"))
        cpu = [math.inf] * 3  # the least CPU of each size's runs: contention from other work only adds to it
        for i, cfg in [(0, one)] + [(1, half), (2, full)] * CALIBRATION_REPEATS:
            c0 = process_cpu_s()
            shard_pipeline.run_outcome(cfg, _IN_PROCESS, progress_every_s=0)
            cpu[i] = min(cpu[i], process_cpu_s() - c0)
            shutil.rmtree(cfg.output, ignore_errors=True)  # the next run of this size starts from nothing again
        raw = sum(len(line) + 1 for _p, lines in slices for line in lines)
        raw_half = sum(len(line) + 1 for _p, lines in slices for line in lines[:max(1, len(lines) // 2)])
        model_s = model_core_s(dataclasses.replace(full, output=os.path.join(root, "model-never")), _IN_PROCESS,
                               len(paths))
        job_per_byte = (cpu[2] - cpu[1]) / (raw - raw_half) if raw > raw_half else 0.0
        overhead = max(0.0, (cpu[2] - cpu[0]) - job_per_byte * raw)
        return Calibration(raw_bytes=raw, job_cpu_per_byte=max(job_per_byte, 0.0),
                           model_cpu_per_byte=model_s / raw, overhead_cpu_s=overhead,
                           one_record_cpu_s=cpu[0])  # the first run here: it pays the lazy imports too
    finally:
        shutil.rmtree(root, ignore_errors=True)
