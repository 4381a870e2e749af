"""Runner preflight: endpoints the driver is told to use must answer before the job is submitted.

A portable job whose EXTERNAL worker pool is not listening fails deep inside gRPC (or, for some job
servers, waits for workers for a long time); a closed job endpoint likewise. Checking both with a plain TCP
connect turns that into an immediate ConfigError naming the flag. The flag sets for Dataflow, Flink and Spark
are in docs/OPERATIONS.md.
"""
from __future__ import annotations

import os
import socket
from typing import Optional

from pipeline.errors import ConfigError
from pipeline.ops.engines.options import check_engine_options

CONNECT_TIMEOUT_S = 5.0
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
# DaskRunner puts a whole Create into one bag partition unless told otherwise, and its Reshuffle is a no-op,
# so without this default every stage of a small job would run in one task. GroupByKeys (our Spread) keep the
# partition count, so it is the job's parallelism: a few tasks per worker thread of a modest cluster.
DEFAULT_DASK_NPARTITIONS = 16

# From this much raw input (unit_plan.raw_bytes_estimate: 3x a compressed file's size) the default runner's
# workers are processes even on <= 4 cores (shard job, pipeline/beam_glue.py chosen_running_mode): gigatoken's
# per-document `encode` holds the GIL, so threads keep ~1.1 of 2 cores busy, and processes pay a fixed start-up
# that the gain meets near this size (docs/BENCHMARKS.md, "Threads or processes: the measured threshold").
PROCESSES_FROM_RAW_BYTES = 48 << 20


def _arg_of(args: list, name: str):
    """(index, value) of Beam argument `name` (`--name=value` or `--name value`), else (None, None)."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return i, args[i + 1]
        if a.startswith(name + "="):
            return i, a.split("=", 1)[1]
    return None, None


def _runner_of(args: list):
    return _arg_of(args, "--runner")


def arg_value(args, name: str) -> Optional[str]:
    """The value of Beam argument `name` (`--direct_num_workers=2` or `--direct_num_workers 2`), else None."""
    return _arg_of(list(args or []), name)[1]


def _is_dask(runner: Optional[str]) -> bool:
    return runner is not None and (runner.lower() in ("dask", "daskrunner") or runner == DASK_RUNNER)


def default_running_mode(cores: Optional[int] = None, raw_bytes: int = 0) -> str:
    """FnApiRunner's running mode when no --runner is given: threads (multi_threading) up to 4 cores and
    PROCESSES_FROM_RAW_BYTES of raw input, worker processes (multi_processing) otherwise.

    Threads skip starting worker processes that each import Beam (on 2 cores at 96 MB: ~1.2 s of wall and
    ~1-2 CPU-s, measured) and share one tokenizer and its warm cache; SentencePiece runs without the GIL (1.85x
    on 2 threads, measured). But the GIL-held share (gigatoken's encode, JSON parsing, packing) caps what
    threads get: above 4 cores always, and on big inputs on small machines, workers are processes.
    Output bytes do not depend on this choice (tests/e2e/test_shard_pipeline.py runs both)."""
    cores = cores or len(os.sched_getaffinity(0))
    return "multi_threading" if cores <= 4 and raw_bytes < PROCESSES_FROM_RAW_BYTES else "multi_processing"


def normalise_beam_args(args: list) -> list:
    """Runner short names Beam does not know (`--runner=DaskRunner`) and runner defaults pileprep relies on."""
    args = list(args)
    i, runner = _runner_of(args)
    if _is_dask(runner) and runner != DASK_RUNNER:
        if args[i] == "--runner":
            args[i + 1] = DASK_RUNNER
        else:
            args[i] = "--runner=" + DASK_RUNNER
        runner = DASK_RUNNER
    if runner == DASK_RUNNER:
        try:  # registers DaskOptions (--dask_client_address & co.) with Beam's option parser
            import apache_beam.runners.dask.dask_runner  # noqa: F401, PLC0415
        except ImportError:
            raise ConfigError("--runner=DaskRunner needs the dask extra: pip install 'pileprep[dask]'") from None
    if runner == DASK_RUNNER and not any(a.startswith(("--dask_npartitions", "--dask_partition_size"))
                                         for a in args):
        args.append(f"--dask_npartitions={DEFAULT_DASK_NPARTITIONS}")
    return args


def dask_cluster_threads(options: dict) -> Optional[int]:
    """The worker threads of the Dask cluster at `--dask_client_address` (summed over its workers), or None
    when no address is given (DaskRunner would start its own local cluster) or the scheduler does not answer
    within CONNECT_TIMEOUT_S. A snapshot: workers that join later are not counted. ~0.1-0.2 s (one client
    connect)."""
    address = options.get("dask_client_address") or options.get("address")
    if not address:
        return None
    try:
        from distributed import Client  # noqa: PLC0415 - the dask extra, present when DaskRunner is chosen

        with Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False) as client:
            return sum(client.nthreads().values()) or None
    except Exception:  # noqa: BLE001 - only a graph-shape hint; the run itself reports an unreachable cluster
        return None


def _host_port(address: str):
    address = address.split("://", 1)[-1]
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def preflight(options: dict) -> None:
    runner = str(options.get("runner") or "")
    checks = check_engine_options(options)
    if runner.endswith("PortableRunner") or runner in ("FlinkRunner", "SparkRunner"):
        endpoint = options.get("job_endpoint")
        if endpoint and endpoint != "embed":
            checks.append(("--job_endpoint", endpoint, "the job service (Flink/Spark job server or "
                                                       "local_job_service_main)"))
    if runner == DASK_RUNNER:
        address = options.get("dask_client_address") or options.get("address")
        if address:
            checks.append(("--dask_client_address", address, "the Dask scheduler (dask scheduler)"))
    if str(options.get("environment_type") or "").upper() == "EXTERNAL":
        config = options.get("environment_config")
        if not config:
            raise ConfigError("--environment_type=EXTERNAL needs --environment_config=HOST:PORT of a worker pool "
                              "(python -m apache_beam.runners.worker.worker_pool_main --service_port PORT)")
        checks.append(("--environment_config", config, "the EXTERNAL worker pool (worker_pool_main)"))
    for flag, address, what in checks:
        hp = _host_port(address)
        if hp is None:
            raise ConfigError(f"{flag}={address}: expected HOST:PORT")
        if not _reachable(*hp):
            raise ConfigError(f"{flag}={address}: nothing answers there; start {what} first or fix the address")


# Local runners hold a whole GroupByKey in the driver's memory (FnApiRunner and the Direct runners built on it,
# Prism), so there the shard job keeps the file spill. Every other runner's GroupByKey is a distributed, spilling
# shuffle (Dataflow Shuffle, Flink and Spark batch, Dask's partitioned groupby, a PortableRunner's job server),
# and the file spill would cost one small read per unit and shard (~1.2 G requests at 1 TB, docs/SHUFFLE.md):
# there the runner moves the pieces (design D). An empty name is the default runner (FnApiRunner).
LOCAL_SHUFFLE_RUNNERS = ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner",
                         "PrismRunner", "InteractiveRunner")


def choose_shuffle(choice: str, runner_name: str) -> str:
    """`--shuffle auto|files|runner` resolved for a runner (a class name or a dotted path): 'files' or 'runner'."""
    if choice in ("files", "runner"):
        return choice
    name = str(runner_name or "").rsplit(".", 1)[-1]
    return "files" if not name or name in LOCAL_SHUFFLE_RUNNERS else "runner"
