"""Beam glue every pileprep job shares: pipeline options, the filesystem options workers re-apply, the two
grouping transforms that replace Reshuffle and side inputs, and the base of the DoFns that carry a job plan.

Small pieces with one job each, so that the job modules (pipeline/shard/shard_pipeline.py,
pipeline/retrieval/build.py, pipeline/retrieval/neighbours.py) hold only their own stages.
"""
from __future__ import annotations

import collections
import os
import threading
from typing import Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.ops import runners
from pipeline.ops.runners import PROCESSES_FROM_RAW_BYTES, default_running_mode  # noqa: F401 - Beam-free, there


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


def concurrent_worker_shutdown() -> None:
    """Make FnApiRunner stop its worker processes all at once at the end of a job, not one after the other
    (idempotent).

    Beam 2.77's WorkerHandlerManager.close_all (fn_api_runner/worker_handlers.py) closes each worker handler in
    turn, and a subprocess worker's close waits for that process to exit (~0.25 s: its harness winds down its
    channels, then the interpreter ends). Two workers cost ~0.5 s of a 6 s job at 96 MB with both cores idle
    (measured with bench/profile_shard.py: "pipeline end"); N workers N x 0.25 s. Here the subprocess workers'
    handlers are closed each on its own thread and joined; every other handler (in-process workers, whose
    threads may still be in native code after a SIGTERM: pipeline/cli.py _exit_without_teardown) is closed in
    turn on the calling thread, as Beam does, which keeps an interrupted run's exit as it was (closing those on
    threads too let `retrieval neighbours` die of the SIGTERM it had already answered, 1 run in 3). Then the
    manager is reset as Beam does; a handler's error is logged as Beam logs it.
    tests/e2e/test_local_runner.py checks the closes overlap."""
    from apache_beam.runners.portability.fn_api_runner import worker_handlers  # noqa: PLC0415

    manager = worker_handlers.WorkerHandlerManager
    if getattr(manager.close_all, "_pileprep_concurrent", False):
        return

    def close_one(worker_handler):
        try:
            worker_handler.close()
        except Exception:  # noqa: BLE001 - as Beam's own close_all: log and go on with the others
            log = worker_handlers._LOGGER  # noqa: SLF001 - Beam's own logger, as its close_all logs
            log.error("Error closing worker_handler %s", worker_handler, exc_info=True)

    def close_all(self):
        handlers = {h for handler_list in self._cached_handlers.values() for h in handler_list}  # noqa: SLF001
        processes = [h for h in handlers if isinstance(h, worker_handlers.SubprocessSdkWorkerHandler)]
        if len(processes) < 2:
            processes = []
        threads = [threading.Thread(target=close_one, args=(h,), name="pileprep-close-worker", daemon=True)
                   for h in processes]
        for t in threads:
            t.start()
        for h in handlers.difference(processes):
            close_one(h)
        for t in threads:
            t.join()
        self._cached_handlers = collections.defaultdict(list)  # noqa: SLF001
        self._workers_by_id = {}  # noqa: SLF001
        if self._grpc_server is not None:  # noqa: SLF001
            self._grpc_server.close()  # noqa: SLF001
            self._grpc_server = None  # noqa: SLF001

    close_all._pileprep_concurrent = True  # noqa: SLF001
    manager.close_all = close_all


def pipeline_options(beam_args) -> PipelineOptions:
    """The job's Beam options: pileprep's runner short names resolved, and the local runner by default. Also
    makes this process's data plane safe for in-process workers (size_flushed_data_plane) and its workers'
    shutdown concurrent (concurrent_worker_shutdown)."""
    size_flushed_data_plane()
    concurrent_worker_shutdown()
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
        current = FileSystems._pipeline_options  # noqa: SLF001 - Beam keeps the worker's options here
        d = current.get_all_options(drop_default=True) if current is not None else {}
        if all(d.get(k) == v for k, v in self.options.items()):
            return
        d.update(self.options)
        FileSystems.set_options(PipelineOptions.from_dictionary(d))


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
