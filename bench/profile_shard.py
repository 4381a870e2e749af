"""Where the shard job's wall time and CPU go, stage by stage, for every process of the run.

    python bench/profile_shard.py --input 'out/sample-corpus/train/*.jsonl.zst' --tokenizer MODEL [shard flags]
    python bench/profile_shard.py --one-mb --input 'out/sample-corpus/train/*.jsonl.zst' --tokenizer MODEL ...

Runs `pileprep shard` once in this process (the CLI's own defaults unless Beam flags are given: on 2 cores
that is FnApiRunner, 2 workers, multi_threading below ~48 MiB of estimated raw input and multi_processing from
there (pipeline/ops/runners.py default_running_mode); pass `--runner=FnApiRunner --direct_num_workers=2
--direct_running_mode=...` to choose).
`--one-mb` first writes the inputs' first 1 MB of raw records to one `.jsonl.zst` in a temporary folder and
runs on that instead: the fixed cost of a run.

Two views of the same run:
- spans: the interpreter's start (process creation to this script's first line), the driver before the
  pipeline (imports; parse, checks, listing, tokenizer load, parity sample and plan), the pipeline's
  construction (graph, pickling, runner and worker start) up to the first stage, every fused stage FnApiRunner
  executes (the stage barriers lie between them), and the commit tail. Per span: wall, CPU-seconds of the
  whole process tree, busy cores (CPU / wall), idle core-seconds (wall x cores - CPU), the longest stretch
  with less than cores - 0.5 cores busy, and the progress markers workers wrote (pipeline/ops/progress.py:
  one per input split and per tokenized unit) during it;
- the window from the first stage that reads records to the end of the commit stage: busy cores on average
  and idle core-seconds (issue target: >= 1.8 of 2 busy).
- skew per span, which load barely touches: CPU-seconds of every thread of this process and of every worker
  process at the span's edges; the busiest `--cores` of them and the sum of (busiest - each) is what the
  span's barrier leaves idle on a quiet machine (FnApiRunner gives each worker a fixed share of a stage's
  elements up front). A serial span (the driver) shows its whole CPU as skew: one core works, the rest wait.
  It is a lower bound: threads that take turns on the GIL (equal CPU, never at once) show no skew, so compare
  the span's busy cores on a quiet machine too (docs/BENCHMARKS.md: gigatoken's per-document encode).
CPU comes from a sampler thread reading the process tree every SAMPLE_S (psutil: this process, its threads and
every descendant, alive or seen alive before) and the machine's total CPU (so a neighbour's load is visible:
`others` = busy cores of the machine outside this run). On a shared machine absolute seconds are noisy;
read the per-stage shares within one run.

FnApiRunner only (stage timing hooks its `_execute_bundle`); other runners print the window totals only.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import threading
import time

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

SAMPLE_S = 0.1
# the first one that reads records
READING_STAGES = ("CutIntoChunks", "CutAndTokenize", "ReadRecords", "SplitFiles", "Tokenize")
COMMIT_STAGE = "CommitManifest"


class Sampler:
    """(time, tree CPU-s, machine busy CPU-s, markers) every SAMPLE_S, from a daemon thread."""

    def __init__(self):
        self.me = psutil.Process()
        self.cores = len(os.sched_getaffinity(0))  # main() sets --cores
        self.started_wall = time.time()
        self.t0 = time.perf_counter()
        self._seen: dict = {}
        self.samples: list = []
        self.marker_dir = None  # set when the plan names the staging directory
        self._lock = threading.Lock()  # edges are sampled from the main thread too
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="profile-sampler")

    def tree_cpu(self) -> float:
        total = sum(self.me.cpu_times()[:2])
        for child in self.me.children(recursive=True):
            try:
                self._seen[child.pid] = sum(child.cpu_times()[:2])
            except psutil.Error:
                pass
        return total + sum(self._seen.values())

    def sample(self) -> tuple:
        with self._lock:
            return self._sample()

    def _sample(self) -> tuple:
        machine = psutil.cpu_times()
        busy = machine.user + machine.nice + machine.system + machine.irq + machine.softirq + machine.steal
        markers = 0
        if self.marker_dir:
            try:
                markers = len(os.listdir(self.marker_dir))
            except OSError:
                pass
        point = (time.perf_counter() - self.t0, self.tree_cpu(), busy, markers)
        self.samples.append(point)
        return point

    def _loop(self):
        while not self._stop.wait(SAMPLE_S):
            self.sample()

    def start(self):
        self.sample()
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join()
        self.sample()

    def between(self, a: float, b: float) -> list:
        return [s for s in self.samples if a - 1e-9 <= s[0] <= b + 1e-9]


def worker_cpu() -> dict:
    """CPU-s so far of every thread of this process and of every child process: the workers are one or the
    other (multi_threading / multi_processing)."""
    me = psutil.Process()
    out = {("thread", t.id): t.user_time + t.system_time for t in me.threads()}
    for child in me.children(recursive=True):
        try:
            out[("process", child.pid)] = sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return out


def skew(before: dict, after: dict, cores: int) -> float:
    """Core-seconds the busiest `cores` threads/processes of a span left idle waiting for the busiest one:
    sum of (max - own CPU) over them. Each worker holds a fixed share of a stage's elements (FnApiRunner
    partitions them up front), so this is the barrier's idle time on an idle machine, whatever the load now."""
    deltas = sorted((after[k] - before.get(k, 0.0) for k in after), reverse=True)[:cores]
    return sum(deltas[0] - d for d in deltas) if deltas else 0.0


class Spans:
    """(label, start, end) in the sampler's clock; the CPU of each comes from the samples, its skew
    (idle core-s at the barrier on a quiet machine) from per-thread / per-process CPU at its edges."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        self.items: list = []
        self.skews: list = []
        self._mark = 0.0
        self._workers = worker_cpu()

    def span(self, label: str) -> None:
        now = self.sampler.sample()[0]  # a sample at every edge: spans shorter than SAMPLE_S stay exact
        workers = worker_cpu()
        self.items.append((label, self._mark, now))
        self.skews.append(skew(self._workers, workers, self.sampler.cores))
        self._mark = now
        self._workers = workers


def measure(samples: list, cores: int) -> dict:
    """Wall, CPU, busy cores, idle core-s, other load, the longest under-busy stretch, markers written."""
    if len(samples) < 2:
        return {"wall": 0.0, "cpu": 0.0, "busy": 0.0, "idle": 0.0, "others": 0.0, "gap": 0.0, "markers": 0}
    wall = samples[-1][0] - samples[0][0]
    cpu = samples[-1][1] - samples[0][1]
    machine = samples[-1][2] - samples[0][2]
    gap = run = 0.0
    for (t0, c0, _, _), (t1, c1, _, _) in zip(samples, samples[1:]):
        if t1 > t0 and (c1 - c0) / (t1 - t0) < cores - 0.5:
            run += t1 - t0
            gap = max(gap, run)
        else:
            run = 0.0
    return {"wall": wall, "cpu": cpu, "busy": cpu / wall if wall else 0.0, "idle": max(0.0, wall * cores - cpu),
            "others": max(0.0, (machine - cpu) / wall) if wall else 0.0, "gap": gap,
            "markers": max(0, samples[-1][3] - samples[0][3])}  # the driver deletes the markers at the end


def report(spans: Spans, cores: int, process_start_s: float) -> str:
    head = (f"{'span':56s} {'start':>6s} {'wall s':>7s} {'CPU s':>7s} {'busy':>5s} {'idle c-s':>8s} "
            f"{'gap s':>6s} {'others':>6s} {'marks':>5s} {'skew c-s':>8s}")
    lines = [head, f"{'python: interpreter start (before this script)':56s} {-process_start_s:6.2f} "
                   f"{process_start_s:7.2f}"]
    for (label, a, b), sk in zip(spans.items, spans.skews):
        m = measure(spans.sampler.between(a, b), cores)
        lines.append(f"{label[:56]:56s} {a:6.2f} {m['wall']:7.2f} {m['cpu']:7.2f} {m['busy']:5.2f} {m['idle']:8.2f} "
                     f"{m['gap']:6.2f} {m['others']:6.2f} {m['markers']:5d} {sk:8.2f}")
    if spans.items:
        m = measure(spans.sampler.between(0.0, spans.items[-1][2]), cores)
        lines.append(f"{'total (this script)':56s} {'':6s} {m['wall']:7.2f} {m['cpu']:7.2f} {m['busy']:5.2f} "
                     f"{m['idle']:8.2f} {m['gap']:6.2f} {m['others']:6.2f} {m['markers']:5d}")
        lines.append(f"wall from process start to the end: {process_start_s + spans.items[-1][2]:.2f} s")
    window = reading_window(spans)
    if window:
        m = measure(spans.sampler.between(*window), cores)
        in_window = sum(sk for (_l, a, b), sk in zip(spans.items, spans.skews) if window[0] <= a and b <= window[1])
        lines.append(f"first record read -> commit ({window[0]:.2f} .. {window[1]:.2f} s): {m['wall']:.2f} s wall, "
                     f"{m['cpu']:.2f} CPU-s, busy {m['busy']:.2f} of {cores} cores, {m['idle']:.2f} idle core-s, "
                     f"longest stretch under {cores - 0.5:g} busy {m['gap']:.2f} s; others' load {m['others']:.2f} "
                     f"cores; skew {in_window:.2f} core-s (quiet-machine estimate: busy "
                     f"{m['cpu'] / max(1e-9, (m['cpu'] + in_window) / cores):.2f} of {cores} if every span were "
                     "CPU-bound and no thread waited on the GIL)")
    return "\n".join(lines)


def reading_window(spans: Spans):
    start = next((a for label, a, _ in spans.items if any(s in label for s in READING_STAGES)), None)
    end = next((b for label, _, b in reversed(spans.items) if COMMIT_STAGE in label), None)
    return (start, end) if start is not None and end is not None and end > start else None


def _stage_label(name: str) -> str:
    """A fused stage's name lists its transforms; keep the user-visible step names."""
    import re  # noqa: PLC0415

    steps = re.findall(r"ref_AppliedPTransform_([A-Za-z]+)", name)
    seen = []
    for s in steps:
        if s not in seen and not s.startswith(("Tag", "Key", "One", "Values", "List", "Chunks", "Impulse")):
            seen.append(s)
    return "stage: " + ("+".join(seen) if seen else name[:40])


def write_first_mb(patterns: list, folder: str, limit: int = 1_000_000) -> str:
    """The first `limit` bytes of whole raw records of the inputs, as one .jsonl.zst under `folder`."""
    import zstandard  # noqa: PLC0415

    from transforms.io.read_records import RawRecord, compression_of, iter_raw_records  # noqa: PLC0415

    out, size = [], 0
    for path in sorted(p for pattern in patterns for p in glob.glob(pattern)):
        with open(path, "rb") as f:
            for item in iter_raw_records(f, compression_of(path)):
                if isinstance(item, RawRecord) and size < limit:
                    out.append(item.data + b"\n")
                    size += len(item.data) + 1
        if size >= limit:
            break
    target = os.path.join(folder, "one-mb.jsonl.zst")
    with open(target, "wb") as f:
        f.write(zstandard.ZstdCompressor(level=3).compress(b"".join(out)))
    return target


def _input_patterns(shard_args: list) -> list:
    if "--input" not in shard_args:
        return []
    i = shard_args.index("--input") + 1
    pats = []
    while i < len(shard_args) and not shard_args[i].startswith("--"):
        pats.append(shard_args[i])
        i += 1
    return pats


def _replace_input(shard_args: list, path: str) -> list:
    i = shard_args.index("--input")
    j = i + 1
    while j < len(shard_args) and not shard_args[j].startswith("--"):
        j += 1
    return shard_args[:i] + ["--input", path] + shard_args[j:]


def main(argv=None) -> int:
    process_start_s = time.time() - psutil.Process().create_time()
    sampler = Sampler()
    sampler.start()
    spans = Spans(sampler)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--one-mb", action="store_true", help="run on the first 1 MB of the inputs' records")
    args, shard_args = p.parse_known_args(argv)
    sampler.cores = args.cores
    tmp = None
    if args.one_mb:
        tmp = tempfile.TemporaryDirectory(prefix="profile-1mb-")
        shard_args = _replace_input(shard_args, write_first_mb(_input_patterns(shard_args), tmp.name))
        sampler.t0 = time.perf_counter()  # the fixed cost starts after the input is written
        sampler.samples.clear()
        sampler.sample()  # (process_start_s stays the interpreter's own start-up: the input's writing is not a cost)

    from apache_beam.runners.portability.fn_api_runner import fn_runner  # noqa: PLC0415

    from pipeline import cli  # noqa: PLC0415
    from pipeline.ops import progress  # noqa: PLC0415
    from pipeline.shard import shard_pipeline  # noqa: PLC0415

    spans.span("driver: import pileprep and Beam")
    execute_bundle = fn_runner.FnApiRunner._execute_bundle  # noqa: SLF001
    first = [True]

    def timed_bundle(self, context, bundle_manager, bundle_input):
        if first[0]:
            spans.span("pipeline: build graph, pickle, start runner and workers")
            first[0] = False
        result = execute_bundle(self, context, bundle_manager, bundle_input)
        spans.span(_stage_label(bundle_manager.stage.name))
        return result

    fn_runner.FnApiRunner._execute_bundle = timed_bundle  # noqa: SLF001
    run_pipeline = shard_pipeline._execute  # noqa: SLF001

    def timed_execute(plan, *a, **k):
        spans.span("driver: parse, check, list inputs, load tokenizer, plan")
        sampler.marker_dir = progress.marker_dir(plan.staging_dir)
        result = run_pipeline(plan, *a, **k)
        spans.span("driver: read back the manifest (pipeline end)")
        return result

    shard_pipeline._execute = timed_execute  # noqa: SLF001
    try:
        rc = cli.main(["shard", "--progress-every", "0", *shard_args])
    finally:
        spans.span("driver: summary, exit")
        sampler.stop()
        if tmp is not None:
            tmp.cleanup()
    print(f"\nrc={rc}; {args.cores} cores; CPU = this process and its worker processes (psutil, every "
          f"{SAMPLE_S:g} s); busy/others in cores; gap = longest stretch under {args.cores - 0.5:g} busy cores; "
          f"marks = progress markers written\n")
    print(report(spans, args.cores, process_start_s))
    return rc


if __name__ == "__main__":
    sys.exit(main())
