"""What a job sends to Spark and Flink, and how the driver waits for it (docs/OPERATIONS.md "Spark and Flink").

- `for_submission(options)`: the options a job service receives. A portable runner sends every pipeline option
  to the job server (apache_beam/runners/portability/portable_runner.py, `encode_pipeline_options`), which hands
  them to the engine: Flink shows them as the job's user configuration (REST `/jobs/<id>/config`, the web UI) and
  keeps them with the job. S3 credentials are therefore left out of that copy; the workers still get them, inside
  the plan pickled into the DoFns (pipeline/beam_glue.py `FilesystemOptions`, applied in every DoFn's setup), as
  they do on the local runner. The driver's own options (its lock, commit and preflight) keep them.
- `pipeline(options)`: `beam.Pipeline` on that copy. Beam's `Pipeline()` hands its options to the process's
  filesystems (apache_beam/pipeline.py, `FileSystems.set_options`), which would leave the driver's S3 client
  without the credentials for what it reads after the job (progress markers, staging clean-up), and Beam's S3
  layer retries that credential error as a server error, for minutes: the driver's filesystems get `options` back.
- `wait_or_cancel(result)`: Ctrl-C (or SIGTERM) while a job runs on a cluster cancels it there before the job
  runner removes its staging and releases the lock (pipeline/job.py `_run`). Beam's own wait turns the signal
  into its cleanup, which stops the job server first: a Flink session cluster then keeps running the job with
  nobody to cancel it. Here the wait runs in a thread; the main thread takes the signal, asks the job service to
  cancel, and waits (bounded) until the wait ends.
"""
from __future__ import annotations

import json
import logging
import signal
import threading
import time
import urllib.request
import uuid

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.ops.engines.options import runner_class
from transforms.io.filesystem_options import set_filesystem_options

LOG = logging.getLogger("pileprep.engines")

SECRET_OPTIONS = ("s3_access_key_id", "s3_secret_access_key", "s3_session_token")
JOB_SERVICE_RUNNERS = ("SparkRunner", "FlinkRunner", "PortableRunner")
CANCEL_TIMEOUT_S = 60.0
FLINK_TERMINAL = ("FINISHED", "CANCELED", "FAILED", "SUSPENDED")


def uses_job_service(options: PipelineOptions) -> bool:
    runner = options.get_all_options(retain_unknown_options=True).get("runner")
    return runner_class(runner) in JOB_SERVICE_RUNNERS  # `--runner=flink` is FlinkRunner to Beam


def for_submission(options: PipelineOptions) -> PipelineOptions:
    """`options` for a job-service runner: without the S3 credentials, and with a `--job_name` of its own (the
    given one, if any, then a random suffix: the name Ctrl-C finds the job by on the engine, `cancel`); other
    runners' options unchanged."""
    if not uses_job_service(options):
        return options
    given = options.get_all_options(drop_default=True, retain_unknown_options=True)
    sent = {k: v for k, v in given.items() if k not in SECRET_OPTIONS}
    # This run's own name even when one is given: Ctrl-C cancels the Flink jobs of that name (`cancel`).
    sent["job_name"] = f"{given.get('job_name') or 'pileprep'}-{uuid.uuid4().hex[:16]}"
    return PipelineOptions.from_dictionary(sent)


def pipeline(options: PipelineOptions) -> beam.Pipeline:
    """`beam.Pipeline(options=for_submission(options))`, this process's filesystems keeping `options`."""
    sent = for_submission(options)
    p = beam.Pipeline(options=sent)
    if sent is not options:
        set_filesystem_options(options)
    return p


def wait_or_cancel(result, options: PipelineOptions, cancel_timeout_s: float = CANCEL_TIMEOUT_S) -> None:
    """`result.wait_until_finish()`; for a job-service run, a signal meanwhile cancels the job on the engine
    first (then the signal's exception goes on)."""
    from apache_beam.runners.portability import portable_runner  # noqa: PLC0415

    if not isinstance(result, portable_runner.PipelineResult):  # in-process: stopped by pipeline/shard/cancel.py
        result.wait_until_finish()
        return
    outcome: dict = {}

    def wait() -> None:
        try:
            outcome["state"] = result.wait_until_finish()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            outcome["error"] = e

    waiter = threading.Thread(target=wait, name="pileprep-engine-wait", daemon=True)
    waiter.start()
    # Beam's SIGINT handler (apache_beam/runners/portability/job_server.py, StopOnExitJobServer) stops the job
    # server before anything else runs, leaving a Flink job running unowned: while the job runs, Ctrl-C is a
    # KeyboardInterrupt here (pipeline/job.py turns it into RunInterrupted(SIGINT)), Beam's handler after.
    main = threading.current_thread() is threading.main_thread()
    beams = signal.signal(signal.SIGINT, signal.default_int_handler) if main else None
    try:
        while waiter.is_alive():
            waiter.join(0.2)  # short joins: the main thread takes SIGINT/SIGTERM between them
    except BaseException:
        if main:  # a second Ctrl-C must not cut the cancel short: the job would run on unowned (bounded wait)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        cancel(result, options, waiter, cancel_timeout_s)
        raise
    finally:
        if main:
            signal.signal(signal.SIGINT, beams)
    if "error" in outcome:
        raise outcome["error"]


def cancel(result, options: PipelineOptions, waiter: threading.Thread, timeout_s: float) -> None:
    """Cancel the job through its job service (Beam's `PipelineResult.cancel`, which then stops a job server it
    started), and on a Flink cluster through the JobManager too: Beam's job server only interrupts its own wait
    (a Flink job left running was seen failing on the staging the driver had removed). Waits, bounded."""
    started = time.monotonic()
    try:
        result.cancel()
    except Exception as e:  # noqa: BLE001 - the job server may already be gone; the signal still goes on
        LOG.warning("could not cancel the job through the job server: %s", type(e).__name__)
    given = options.get_all_options(retain_unknown_options=True)
    master = str(given.get("flink_master") or "")
    # A Flink master that is an address (not [auto]/[local]); Beam has cleared --runner by now (and prefixed the
    # address with http://).
    if master and not master.startswith("["):
        cancel_on_flink(master, str(given.get("job_name") or ""), timeout_s)
    waiter.join(max(1.0, timeout_s - (time.monotonic() - started)))
    LOG.info("engine job cancelled (%.1f s)", time.monotonic() - started)


def _flink(master: str, path: str, method: str = "GET") -> dict:
    base = master if "://" in master else f"http://{master}"
    req = urllib.request.Request(f"{base.rstrip('/')}{path}", method=method)
    with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310 - the job's own --flink_master
        body = r.read()
    return json.loads(body) if body else {}


def cancel_on_flink(master: str, job_name: str, timeout_s: float) -> list:
    """Cancel the jobs named `job_name` still running on the Flink JobManager at `master` (REST: PATCH
    /jobs/<id>?mode=cancel) and wait until they are terminal; returns their last states."""
    states: list = []
    try:
        jobs = [j for j in _flink(master, "/jobs/overview")["jobs"] if j.get("name") == job_name]
        for j in jobs:
            if j.get("state") not in FLINK_TERMINAL:
                _flink(master, f"/jobs/{j['jid']}?mode=cancel", method="PATCH")
        deadline = time.monotonic() + timeout_s
        while jobs and time.monotonic() < deadline:
            states = [_flink(master, f"/jobs/{j['jid']}")["state"] for j in jobs]
            if all(s in FLINK_TERMINAL for s in states):
                break
            time.sleep(0.5)
    except (OSError, ValueError, KeyError) as e:
        LOG.warning("could not cancel the job on the Flink JobManager %s: %s", master, type(e).__name__)
    return states
