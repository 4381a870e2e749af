"""Progress while a shard job runs, and the final summary: rates, ETA, counters.

Counters come from Beam metrics (namespace "pileprep": input_files, input_bytes, documents, tokens,
records, raw_bytes, examples). Runners that serve metrics while the job runs (Dataflow, Flink/Spark job
servers) are polled directly. FnApiRunner and Beam's local job service only hand metrics over at the end, so
the same counters are also written by the workers as tiny per-unit progress markers in the staging directory
(`<staging>/progress/*.json`, one per cut input file and per tokenized chunk); the driver sums whichever
source is further along. Markers work on every runner and filesystem (local, EFS, S3) because staging does.

ETA: the input size is known up front (compressed bytes); the text volume is not. Once files have been cut
the compression ratio seen so far scales the input size into an estimate of the raw text still to tokenize.
"""
from __future__ import annotations

import json
import logging
import shutil
import threading
import uuid
import time
from dataclasses import dataclass
from typing import Callable, Optional

from apache_beam.io.filesystems import FileSystems

from transforms.io import io_utils

LOG = logging.getLogger("pileprep.progress")
NAMESPACE = "pileprep"
COUNTERS = ("input_files", "input_bytes", "records", "documents", "tokens", "raw_bytes", "examples", "dead_letters",
            "units_tokenized", "units_reused", "shards_packed", "shards_reused")  # the last four: a resumed run's own
# work (pipeline/shard/resume.py)


# ------------------------------------------------------------------------------------------ marker files
def marker_dir(staging_dir: str) -> str:
    """Beside the generation's staging directory (inside the staging root), not in it: the commit deletes
    staging on a worker, and the driver still reads the markers afterwards for the final counters and reruns
    (runners without live metrics, DaskRunner, report nothing else). The driver deletes it at the end."""
    return staging_dir.rstrip("/") + ".progress"


RERUN_TAG = ".rerun-"


def write_marker(staging_dir: str, name: str, counters: dict) -> None:
    """Best effort: progress reporting must never fail a bundle.

    Each unit of work has one marker name. If it exists already, the work ran again (a retried bundle, a
    recovered worker, or a runner that recomputes a stage): that is recorded as a separate rerun marker, which
    is counted apart and never added to the progress counters, so reruns are visible and never double-counted.
    """
    path = io_utils.join(marker_dir(staging_dir), name + ".json")
    try:
        if io_utils.exists(path):
            path = io_utils.join(marker_dir(staging_dir), f"{name}{RERUN_TAG}{uuid.uuid4().hex}.json")
        io_utils.write_bytes(path, json.dumps(counters, sort_keys=True).encode("utf-8"))
    except Exception as e:  # noqa: BLE001
        LOG.debug("progress marker %s not written: %s", name, e)


class MarkerReader:
    """Sums the markers under a staging dir; reads each marker once (they are written once, never changed)."""

    def __init__(self, staging_dir: str):
        self.pattern = io_utils.join(marker_dir(staging_dir), "*.json")
        self.seen: dict = {}

    def snapshot(self) -> dict:
        try:
            paths = [m.path for m in FileSystems.match([self.pattern])[0].metadata_list]
        except Exception:  # noqa: BLE001 - nothing written yet (or staging already cleaned up)
            paths = []
        for path in paths:
            if path in self.seen:
                continue
            try:
                self.seen[path] = json.loads(io_utils.read_bytes(path))
            except Exception:  # noqa: BLE001 - half-written on an eventually consistent store: next time
                continue
        total = {k: 0 for k in COUNTERS}
        split_raw = 0
        reruns = sum(1 for path in self.seen if RERUN_TAG in path)
        for path, d in self.seen.items():
            if RERUN_TAG in path:
                continue
            for k in COUNTERS:
                total[k] += int(d.get(k, 0))
            split_raw += int(d.get("split_raw_bytes", 0))
        total["split_raw_bytes"] = split_raw
        if reruns:
            total["stage_reruns"] = reruns
        return total


# ---------------------------------------------------------------------------------------- Beam metrics
def counters_from_result(result) -> dict:
    """Committed (else attempted) values of the pileprep counters from a PipelineResult; {} if unavailable."""
    from apache_beam.metrics.metric import MetricsFilter  # noqa: PLC0415

    try:
        query = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    except Exception:  # noqa: BLE001 - some runners have no metrics (yet)
        return {}
    out: dict = {}
    for c in query.get("counters", []):
        value = c.committed if c.committed is not None else c.attempted
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(value or 0)
    return out


# ----------------------------------------------------------------------------------------------- rates
@dataclass
class Progress:
    elapsed_s: float
    counters: dict[str, int]  # counter name (COUNTERS, split_raw_bytes, stage_reruns) -> count
    total_input_bytes: int = 0
    total_input_files: int = 0

    @property
    def docs_per_s(self) -> float:
        return self.counters.get("documents", 0) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.counters.get("tokens", 0) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        """Raw text tokenized per second (MB = 10^6 bytes)."""
        return self.counters.get("raw_bytes", 0) / 1e6 / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> Optional[float]:
        """Seconds left, when the input size is known and some text has been both cut and tokenized."""
        c = self.counters
        done_raw, split_in, split_raw = c.get("raw_bytes", 0), c.get("input_bytes", 0), c.get("split_raw_bytes", 0)
        if not self.total_input_bytes or not done_raw or not split_in or self.elapsed_s <= 0:
            return None
        ratio = (split_raw or done_raw) / split_in  # raw text bytes per input byte, seen so far
        total_raw = max(self.total_input_bytes * ratio, done_raw)
        return (total_raw - done_raw) / (done_raw / self.elapsed_s)

    @property
    def fraction(self) -> Optional[float]:
        eta = self.eta_s
        if eta is None:
            return None
        return self.elapsed_s / (self.elapsed_s + eta) if self.elapsed_s + eta > 0 else 1.0

    def line(self) -> str:
        c = self.counters
        eta = self.eta_s
        tail = f"  ETA {eta:,.0f}s ({self.fraction:.0%})" if eta is not None else "  ETA n/a"
        return (f"[{self.elapsed_s:7.1f}s] files {c.get('input_files', 0)}/{self.total_input_files or '?'}  "
                f"docs {c.get('documents', 0):,} ({self.docs_per_s:,.0f}/s)  tokens {c.get('tokens', 0):,} "
                f"({self.tokens_per_s:,.0f}/s)  text {c.get('raw_bytes', 0) / 1e6:,.1f} MB "
                f"({self.mb_per_s:,.2f} MB/s)  dead letters {c.get('dead_letters', 0):,}{tail}")

    def bar(self, width: int) -> str:
        """One terminal line: a bar (when the fraction is known) and the rates, cut to `width` columns."""
        c = self.counters
        frac = self.fraction
        eta = self.eta_s
        bar = ""
        if frac is not None:
            n = 20
            filled = min(n, int(round(frac * n)))
            bar = f"[{'#' * filled}{'.' * (n - filled)}] {frac:4.0%} "
        text = (f"{bar}{c.get('documents', 0):,} docs {self.docs_per_s:,.0f}/s | {self.tokens_per_s:,.0f} tok/s | "
                f"{self.mb_per_s:,.2f} MB/s | dead {c.get('dead_letters', 0):,} | "
                f"ETA {'n/a' if eta is None else f'{eta:,.0f}s'} | {self.elapsed_s:,.0f}s")
        return text[:max(10, width - 1)]

    def to_dict(self) -> dict:
        eta = self.eta_s
        return {"elapsed_s": round(self.elapsed_s, 3), "counters": dict(sorted(self.counters.items())),
                "docs_per_s": round(self.docs_per_s, 3), "tokens_per_s": round(self.tokens_per_s, 3),
                "mb_per_s": round(self.mb_per_s, 6), "eta_s": None if eta is None else round(eta, 3)}


def merge_snapshots(*snapshots: dict) -> dict:
    """Per counter, the most advanced source wins (metrics and markers count the same events)."""
    out: dict = {}
    for snap in snapshots:
        for k, v in (snap or {}).items():
            out[k] = max(out.get(k, 0), v)
    return out


def final_counters(metrics: dict, markers: dict) -> dict:
    """The finished run's counters: the markers' count wherever they have one (written once per unit of work,
    a rerun apart: exact when a runner re-executes bundles or recomputes a stage), else the metric's. Spark's
    metrics are attempted counts: it recomputes a stage whose output two stages read, so they overcount
    (records 230 of 172 read on tests/e2e/test_engines_spark.py's corpus)."""
    out = dict(metrics or {})
    for k, v in (markers or {}).items():
        if v or k not in out:  # a zero marker count is kept where no metric has the counter (every key stays)
            out[k] = v
    return out


class ProgressReporter:
    """A daemon thread: every `every_s`, take a snapshot and hand a Progress line to the log and `on_progress`."""

    def __init__(self, sources: list, total_input_bytes: int, total_input_files: int, every_s: float = 10.0,
                 on_progress: Optional[Callable] = None, clock=time.monotonic):
        self.sources = sources  # callables returning counter dicts
        self.total_input_bytes = total_input_bytes
        self.total_input_files = total_input_files
        self.every_s = every_s
        self.on_progress = on_progress
        self.clock = clock
        self.started = clock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.reports: list = []

    def poll(self) -> Progress:
        snaps = []
        for source in self.sources:
            try:
                snaps.append(source())
            except Exception as e:  # noqa: BLE001 - progress is advisory
                LOG.debug("progress source failed: %s", e)
        p = Progress(self.clock() - self.started, merge_snapshots(*snaps), self.total_input_bytes,
                     self.total_input_files)
        self.reports.append(p)
        LOG.info("progress %s", p.line(), extra={"progress": p})
        if self.on_progress is not None:
            self.on_progress(p)
        return p

    def _loop(self):
        while not self._stop.wait(self.every_s):
            self.poll()

    def __enter__(self):
        if self.every_s and self.every_s > 0:
            self._thread = threading.Thread(target=self._loop, name="pileprep-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return False


class Display(logging.Handler):
    """Shows the reporter's progress on a stream (the real stderr): a line refreshed in place on a terminal,
    one plain line per report otherwise (logs, CI). Attach to the "pileprep.progress" logger."""

    PREFIX = "pileprep: progress "

    def __init__(self, stream, tty: bool):
        super().__init__(logging.INFO)
        self.stream = stream
        self.tty = tty
        self._open_line = False

    def emit(self, record: logging.LogRecord) -> None:
        from pipeline.ops.safe_text import terminal  # noqa: PLC0415

        p = getattr(record, "progress", None)
        if p is None:
            return
        try:
            if self.tty:
                width = shutil.get_terminal_size((100, 20)).columns
                self.stream.write("\r\x1b[K" + terminal(p.bar(width)))  # our escape, then inert text
                self._open_line = True
            else:
                self.stream.write(self.PREFIX + terminal(p.line()) + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed terminal must not fail the job
            pass

    def finish(self) -> None:
        """End the refreshed line so that what follows starts on its own line."""
        if self._open_line:
            try:
                self.stream.write("\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass
            self._open_line = False


def is_progress_record(record: logging.LogRecord) -> bool:
    return hasattr(record, "progress")


def summary_table(counters: dict, elapsed_s: float, extra_rows: Optional[list] = None) -> str:
    """The final table: every counter with its rate."""
    from pipeline.ops.safe_text import terminal  # noqa: PLC0415

    rows = [("counter", "total", "per second")]
    for name in sorted(counters):
        v = counters[name]
        rows.append((terminal(name), f"{v:,}", f"{v / elapsed_s:,.1f}" if elapsed_s > 0 else "-"))
    rows.append(("wall time", f"{elapsed_s:,.1f}s", ""))
    for r in extra_rows or []:  # counter names and extra cells may carry source names or reasons: the data's
        rows.append(tuple(terminal(cell) for cell in r))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}" for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
