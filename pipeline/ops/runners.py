"""Runner preflight: endpoints the driver is told to use must answer before the job is submitted.

A portable job whose EXTERNAL worker pool is not listening fails deep inside gRPC (or, for some job
servers, waits for workers for a long time); a closed job endpoint likewise. Checking both with a plain TCP
connect turns that into an immediate ConfigError naming the flag. The flag sets for Dataflow, Flink and Spark
are in docs/OPERATIONS.md.
"""
from __future__ import annotations

import socket

from pipeline.config import ConfigError

CONNECT_TIMEOUT_S = 5.0


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
    checks = []
    if runner.endswith("PortableRunner") or runner in ("FlinkRunner", "SparkRunner"):
        endpoint = options.get("job_endpoint")
        if endpoint and endpoint != "embed":
            checks.append(("--job_endpoint", endpoint, "the job service (Flink/Spark job server or "
                                                       "local_job_service_main)"))
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
