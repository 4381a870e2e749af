"""Stopping in-process workers when the driver gives up on a run (a signal, or another worker's failure).

With FnApiRunner's in_memory and multi_threading modes the workers are threads of the driver's process. When
the driver stops waiting (SIGTERM raises RunInterrupted in the main thread; a failed bundle raises there too),
those threads would go on tokenizing and writing into the staging directory the driver is about to remove, and
a thread still inside native tokenizer code when the interpreter exits aborts the process (exit 134 instead of
143, seen). So the stage functions take a `check_cancelled` callable they call between batches, DoFns run them
through `call`, and the driver sets the flag and waits for the running calls to return before it cleans up.
Worker processes (multi_processing, remote runners) never see the flag: their runner stops them.
"""
from __future__ import annotations

import logging
import sys
import threading
import time

_stop = threading.Event()
_active = 0
_active_lock = threading.Condition()


class RunCancelled(RuntimeError):
    """Raised inside a stage function once the driver has cancelled the run."""


def cancelled() -> bool:
    return _stop.is_set()


def check() -> None:
    if _stop.is_set():
        raise RunCancelled("the run was cancelled by its driver")


def call(fn, *args):
    """Run one stage call (a DoFn's work) as in-process work; None once the driver has cancelled the run.

    A cancelled call ends quietly instead of raising: the driver has already left the pipeline and reported
    why, and a raised error would only add a worker traceback after its one-line message."""
    global _active
    if _stop.is_set():
        return None
    with _active_lock:
        _active += 1
    try:
        return fn(*args)
    except RunCancelled:
        return None
    finally:
        with _active_lock:
            _active -= 1
            _active_lock.notify_all()


# Beam's in-process SDK worker reports every bundle it was still running when the runner shut down (the runner
# has already dropped the bundle: KeyError on release), both as a log record and as a traceback it `print`s
# straight to sys.stderr (sdk_worker.SdkHarness._execute), and either can land before or after the driver's
# one-line message (both seen in CI). Once the run is cancelled they say nothing, so until the next run starts
# (reset()) the worker loggers drop their records and sys.stderr passes only the main thread's writes: the
# driver reports the run's end from the main thread; worker threads only report the bundles it abandoned.
_BEAM_WORKER_LOGGERS = ("apache_beam.runners.worker.sdk_worker", "apache_beam.runners.worker.bundle_processor",
                        "apache_beam.runners.worker.data_plane", "apache_beam.runners.worker.operations",
                        "apache_beam.runners.portability.fn_api_runner.worker_handlers")


class _DropWhileCancelled(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _stop.is_set()


_DROP_WHILE_CANCELLED = _DropWhileCancelled()


class _MainThreadStderr:
    """sys.stderr while a run is cancelled: the main thread writes through, other threads' writes are dropped."""

    def __init__(self, wrapped):
        self.wrapped = wrapped

    def write(self, text):
        if _stop.is_set() and threading.current_thread() is not threading.main_thread():
            return len(text)
        return self.wrapped.write(text)

    def __getattr__(self, name):  # flush, fileno, encoding, isatty ... of the real stream
        return getattr(self.wrapped, name)


def _quiet_beam_workers() -> None:
    for name in _BEAM_WORKER_LOGGERS:
        logger = logging.getLogger(name)
        if _DROP_WHILE_CANCELLED not in logger.filters:
            logger.addFilter(_DROP_WHILE_CANCELLED)
    if not isinstance(sys.stderr, _MainThreadStderr):
        sys.stderr = _MainThreadStderr(sys.stderr)


def cancel_and_wait(timeout_s: float = 30.0) -> bool:
    """Ask in-process stage calls to stop; True once none is running (False after `timeout_s`)."""
    _quiet_beam_workers()
    _stop.set()
    deadline = time.monotonic() + timeout_s
    with _active_lock:
        while _active:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            _active_lock.wait(left)
    return True


def reset() -> None:
    """A new run in this process starts uncancelled (tests run several jobs in one interpreter)."""
    _stop.clear()
    if isinstance(sys.stderr, _MainThreadStderr):
        sys.stderr = sys.stderr.wrapped
