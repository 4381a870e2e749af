"""Where the shard job's wall time and CPU go, stage by stage, for every process of the run.

    python bench/profile_shard.py --input 'out/sample-corpus/train/*.jsonl.zst' --tokenizer MODEL [shard flags]

Runs `pileprep shard` once in this process (the CLI's own defaults unless --runner flags are given) and times:
- the driver before the pipeline (imports, input listing, tokenizer load, parity sample: `prepare`);
- the pipeline's construction (graph, pickling, runner start) up to the first stage;
- every fused stage FnApiRunner executes (the stage barriers are between them), and the commit tail.
For each span it prints wall seconds, CPU seconds of the whole process tree (this process, its threads, and
worker processes, read with psutil at the span's edges), and how busy the machine's cores were:
busy = CPU / (wall x cores). Idle core-seconds (wall x cores - CPU) are what a stage barrier, a start-up
or a serial step costs; `bench/shard_bench.py` gives the resulting throughput ratios.

FnApiRunner only (stage timing hooks its `_execute_bundle`); other runners print the totals.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


class Timeline:
    """(label, wall start, wall end, CPU-seconds) spans, CPU read from the whole process tree."""

    def __init__(self):
        self.me = psutil.Process()
        self.spans: list = []
        self.dead_children_cpu = 0.0
        self._seen: dict = {}
        self.t0 = time.perf_counter()
        self._mark = (self.t0, self.cpu())

    def cpu(self) -> float:
        """CPU seconds of this process and every descendant (alive now, or seen alive before)."""
        total = sum(self.me.cpu_times()[:2])
        for child in self.me.children(recursive=True):
            try:
                self._seen[child.pid] = sum(child.cpu_times()[:2])
            except psutil.Error:
                pass
        return total + sum(self._seen.values())

    def span(self, label: str) -> None:
        now, cpu = time.perf_counter(), self.cpu()
        self.spans.append((label, self._mark[0] - self.t0, now - self.t0, cpu - self._mark[1]))
        self._mark = (now, cpu)

    def report(self, cores: int) -> str:
        lines = [f"{'span':58s} {'start':>6s} {'wall s':>7s} {'CPU s':>7s} {'busy':>5s} {'idle core-s':>11s}"]
        wall_total = cpu_total = 0.0
        for label, a, b, cpu in self.spans:
            wall = b - a
            wall_total += wall
            cpu_total += cpu
            lines.append(f"{label[:58]:58s} {a:6.2f} {wall:7.2f} {cpu:7.2f} {cpu / max(wall * cores, 1e-9):5.0%} "
                         f"{max(0.0, wall * cores - cpu):11.2f}")
        busy = cpu_total / max(wall_total * cores, 1e-9)
        lines.append(f"{'total':58s} {'':6s} {wall_total:7.2f} {cpu_total:7.2f} {busy:5.0%} "
                     f"{max(0.0, wall_total * cores - cpu_total):11.2f}")
        return "\n".join(lines)


def _stage_label(name: str) -> str:
    """A fused stage's name lists its transforms; keep the user-visible step names."""
    import re  # noqa: PLC0415

    steps = re.findall(r"ref_AppliedPTransform_([A-Za-z]+)", name)
    seen = []
    for s in steps:
        if s not in seen and not s.startswith(("Tag", "Key", "One", "Values", "List", "Chunks", "Impulse")):
            seen.append(s)
    return "stage: " + ("+".join(seen) if seen else name[:40])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    args, shard_args = p.parse_known_args(argv)
    timeline = Timeline()

    from apache_beam.runners.portability.fn_api_runner import fn_runner  # noqa: PLC0415

    from pipeline import cli  # noqa: PLC0415
    from pipeline.shard import shard_pipeline  # noqa: PLC0415

    timeline.span("driver: import pileprep and Beam")
    execute_bundle = fn_runner.FnApiRunner._execute_bundle  # noqa: SLF001
    first = [True]

    def timed_bundle(self, context, bundle_manager, bundle_input):
        if first[0]:
            timeline.span("pipeline: build graph, pickle, start runner and workers")
            first[0] = False
        result = execute_bundle(self, context, bundle_manager, bundle_input)
        timeline.span(_stage_label(bundle_manager.stage.name))
        return result

    fn_runner.FnApiRunner._execute_bundle = timed_bundle  # noqa: SLF001
    run_pipeline = shard_pipeline._execute  # noqa: SLF001

    def timed_execute(*a, **k):
        timeline.span("driver: parse, check, list inputs, load tokenizer, plan")
        result = run_pipeline(*a, **k)
        timeline.span("driver: read back the manifest, summary")
        return result

    shard_pipeline._execute = timed_execute  # noqa: SLF001
    rc = cli.main(["shard", "--progress-every", "0", *shard_args])
    print(f"\nrc={rc}; {args.cores} cores; CPU = this process and its worker processes (psutil)\n")
    print(timeline.report(args.cores))
    return rc


if __name__ == "__main__":
    sys.exit(main())
