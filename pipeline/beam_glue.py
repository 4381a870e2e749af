"""Beam glue every pileprep job shares: pipeline options, the filesystem options workers re-apply, the two
grouping transforms that replace Reshuffle and side inputs, and the base of the DoFns that carry a job plan.

Small pieces with one job each, so that the job modules (pipeline/shard/shard_pipeline.py,
pipeline/retrieval/build.py, pipeline/retrieval/neighbours.py) hold only their own stages.
"""
from __future__ import annotations

import os
from typing import Optional

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.ops import runners
from pipeline.ops.runners import PROCESSES_FROM_RAW_BYTES, default_running_mode  # noqa: F401 - Beam-free, there
from transforms.io.filesystem_options import filesystem_options, set_filesystem_options


def default_beam_args(cores: Optional[int] = None) -> list:
    """The local runner when no --runner is given: FnApiRunner, one worker per core, in the running mode
    default_running_mode picks before the input's size is known (a job that knows it may change the mode:
    chosen_running_mode)."""
    cores = cores or len(os.sched_getaffinity(0))
    return ["--runner=FnApiRunner", f"--direct_num_workers={cores}",
            f"--direct_running_mode={default_running_mode(cores)}"]


def running_mode_is_default(beam_args) -> bool:
    """Whether the running mode comes from default_beam_args: neither --runner nor --direct_running_mode given."""
    return not any(str(a).startswith(("--runner", "--direct_running_mode")) for a in beam_args or [])


def chosen_running_mode(options: PipelineOptions, beam_args, raw_bytes: int) -> Optional[str]:
    """Set the default runner's running mode for an input of `raw_bytes` (default_running_mode) in `options`
    (built by pipeline_options from the same `beam_args`); returns the mode, or None when the user chose the
    runner or the mode (then nothing changes)."""
    if not running_mode_is_default(beam_args):
        return None
    from apache_beam.options.pipeline_options import DirectOptions  # noqa: PLC0415

    direct = options.view_as(DirectOptions)
    direct.direct_running_mode = default_running_mode(direct.direct_num_workers or None, raw_bytes)
    return direct.direct_running_mode


# The one patch of Beam's internals pileprep keeps, because without it elements are lost, not time. Upstream
# defect: Beam's TimeBasedBufferingClosableOutputStream (apache_beam/runners/worker/data_plane.py, time-based
# flushing added by BEAM-7949, apache/beam#10246) flushes from its PeriodicThread without the lock the writing
# thread would need, so a write between the flush's `get()` and `_clear()` is dropped. Checked against the
# pinned apache-beam==2.77.0 (pyproject.toml); on a Beam upgrade, re-read that class and rerun
# tests/e2e/test_threaded_data_plane.py before moving the pin.
def size_flushed_data_plane() -> None:
    """Turn off Beam's time-based flushing of data-plane output buffers in this process (idempotent).

    With FnApiRunner's multi_threading workers (the default above) and on the runner's own side of the data plane,
    Beam 2.77 buffers each bundle's outputs in a TimeBasedBufferingClosableOutputStream
    (apache_beam/runners/worker/data_plane.py): a PeriodicThread flushes it every 1000 ms
    (fn_api_runner/worker_handlers.py: DATA_BUFFER_TIME_LIMIT_MS) with `get()` then `_clear()`, holding a lock
    the bundle's thread never takes when it writes elements into that buffer. Elements written between the two
    calls are dropped without an error; on a loaded machine the flusher is descheduled in that window and a run
    of elements vanishes (a chunk database lost 9 documents of one shard file between ReadPieces and the join
    in pipeline/retrieval/build.py). The timed flush only lowers latency for streaming; batch jobs need only the
    size-based flush, which the writing thread does itself between elements. So every output stream is created
    size-based. Worker subprocesses (multi_processing) already default to 0 (sdk_worker_main.py).
    tests/e2e/test_threaded_data_plane.py forces the window open.
    """
    from apache_beam.runners.worker import data_plane  # noqa: PLC0415

    create = data_plane.ClosableOutputStream.create
    if getattr(create, "_pileprep_size_flushed", False):
        return

    def size_flushed(close_callback, flush_callback, data_buffer_time_limit_ms):  # noqa: ARG001 - ignored on purpose
        return create(close_callback, flush_callback, 0)

    size_flushed._pileprep_size_flushed = True  # noqa: SLF001
    data_plane.ClosableOutputStream.create = staticmethod(size_flushed)


def pipeline_options(beam_args) -> PipelineOptions:
    """The job's Beam options: pileprep's runner short names resolved, and the local runner by default. Also
    makes this process's data plane safe for in-process workers (size_flushed_data_plane)."""
    size_flushed_data_plane()
    args = runners.normalise_beam_args(beam_args or [])
    if not any(a.startswith("--runner") for a in args):
        args = default_beam_args() + args
    return PipelineOptions(args)


class FilesystemOptions:
    """The job's filesystem options (s3_*), re-applied on workers.

    FnApiRunner's worker processes and some worker pools start without the job's pipeline options, so Beam's
    S3 filesystem there would ignore `--s3_endpoint_url` & co. The plan carries them and every DoFn applies
    them in setup(). The repr hides the values (credentials may be among them).
    """

    def __init__(self, options: dict):
        self.options = dict(options)

    def __repr__(self):
        return f"FilesystemOptions({sorted(self.options)})"

    @classmethod
    def from_pipeline_options(cls, options: PipelineOptions) -> Optional["FilesystemOptions"]:
        d = options.get_all_options(drop_default=True)
        picked = {k: v for k, v in d.items() if k.startswith("s3_") and v is not None}
        return cls(picked) if picked else None

    def apply(self) -> None:
        given = filesystem_options()  # what this process gave Beam (transforms/io/filesystem_options.py)
        if all(given.get(k) == v for k, v in self.options.items()):
            return
        given.update(self.options)
        set_filesystem_options(PipelineOptions.from_dictionary(given))


def apply_filesystem_options(options: Optional[FilesystemOptions]) -> None:
    """The one place a worker (or the driver) applies a plan's filesystem options; None: nothing to apply."""
    if options is not None:
        options.apply()


def s3_options_of(options: Optional[FilesystemOptions]) -> dict:
    """The plain dict of s3_* options (for the lock and the storage preflight), {} when there are none."""
    return options.options if options is not None else {}


class PlanDoFn(beam.DoFn):
    """A DoFn that carries its job's plan and prepares the worker in setup() (`plan.setup_worker()`: the
    filesystem options, and whatever else the job's workers need once). Subclasses add their own setup after
    calling `super().setup()`."""

    def __init__(self, plan):
        super().__init__()
        self.plan = plan

    def setup(self):
        self.plan.setup_worker()


class Spread(beam.PTransform):
    """Redistribute elements over workers by a deterministic key: a GroupByKey every runner implements.

    Beam's Reshuffle is a no-op on some runners (DaskRunner keeps every element in the partition that made it,
    so all chunks of one file would tokenize in one task); grouping by a key spreads them on all of them. The
    key only decides placement: element order never reaches the output, which is sorted by name downstream.
    """

    def __init__(self, key_fn):
        super().__init__()
        self.key_fn = key_fn

    def expand(self, pcoll):
        return (pcoll
                | "Key" >> beam.Map(lambda x, key_fn: (key_fn(x), x), self.key_fn)
                | "Group" >> beam.GroupByKey()
                | "Values" >> beam.FlatMap(lambda kv: kv[1]))


class GatherAll(beam.PTransform):
    """All elements of a PCollection as one list, in one element, through a GroupByKey on a single key.

    Used instead of side inputs: runners that build a side input by recomputing its producer inside the
    consuming task (DaskRunner) would rerun a whole stage per consumer; a main-input join runs it once.
    """

    def expand(self, pcoll):
        return (pcoll
                | "OneKey" >> beam.Map(lambda x: (0, x))
                | "Group" >> beam.GroupByKey()
                | "List" >> beam.Map(lambda kv: list(kv[1])))
