"""The Python SDK worker's boot for `--environment_type=PROCESS` on Spark and Flink (the engines' executors start
it once per worker), with pileprep already installed on the node, as an EMR bootstrap action or `make setup` does.

Beam's container entry point (the Go `boot` of its SDK images) asks the runner's provision service for the
pipeline options and endpoints, installs the staged artifacts, then execs `sdk_worker_main`. Here nothing is
installed (the node's venv is the environment; no image, no pip at run time): this asks the provision service and
execs `python -m apache_beam.runners.worker.sdk_worker_main` from the same interpreter, with the environment that
module reads (apache_beam/runners/worker/sdk_worker_main.py, create_harness).

    sdk-worker --id=ID --provision_endpoint=HOST:PORT [--control_endpoint=...] [--logging_endpoint=...] ...
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Optional

PROVISION_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class BootFlags:
    worker_id: str
    provision_endpoint: str
    control_endpoint: Optional[str]
    logging_endpoint: Optional[str]
    semi_persistent_directory: str


def parse_flags(argv: list) -> BootFlags:
    p = argparse.ArgumentParser(prog="sdk-worker", add_help=False)
    p.add_argument("--id", default="")
    p.add_argument("--provision_endpoint", required=True)
    p.add_argument("--control_endpoint")
    p.add_argument("--logging_endpoint")
    p.add_argument("--artifact_endpoint")  # staged artifacts are not installed: the node's venv is the environment
    p.add_argument("--semi_persistent_directory", default="")
    a, _unknown = p.parse_known_args(argv)
    return BootFlags(a.id, a.provision_endpoint, a.control_endpoint, a.logging_endpoint,
                     a.semi_persistent_directory)


def worker_environment(flags: BootFlags, info, base_env: dict) -> dict:
    """The environment `sdk_worker_main` reads, from the boot flags and the runner's ProvisionInfo (pure)."""
    from google.protobuf import json_format, text_format  # noqa: PLC0415 - only in the worker process

    env = dict(base_env)
    env["WORKER_ID"] = flags.worker_id
    env["PIPELINE_OPTIONS"] = json_format.MessageToJson(info.pipeline_options)
    env["RUNNER_CAPABILITIES"] = " ".join(info.runner_capabilities)
    env["SEMI_PERSISTENT_DIRECTORY"] = flags.semi_persistent_directory
    logging_url = info.logging_endpoint.url or flags.logging_endpoint
    control_url = info.control_endpoint.url or flags.control_endpoint
    if not control_url:
        raise SystemExit("sdk-worker: the runner gave no control endpoint")
    env["CONTROL_API_SERVICE_DESCRIPTOR"] = f'url: "{control_url}"'
    if logging_url:
        env["LOGGING_API_SERVICE_DESCRIPTOR"] = f'url: "{logging_url}"'
    if info.status_endpoint.url:
        env["STATUS_API_SERVICE_DESCRIPTOR"] = text_format.MessageToString(info.status_endpoint)
    return env


def provision_info(flags: BootFlags):
    from apache_beam.portability.api import beam_provision_api_pb2, beam_provision_api_pb2_grpc  # noqa: PLC0415
    from apache_beam.runners.worker.channel_factory import GRPCChannelFactory  # noqa: PLC0415

    with GRPCChannelFactory.insecure_channel(flags.provision_endpoint) as channel:
        stub = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel)
        response = stub.GetProvisionInfo(beam_provision_api_pb2.GetProvisionInfoRequest(),
                                         metadata=[("worker_id", flags.worker_id)], timeout=PROVISION_TIMEOUT_S)
    return response.info


def main(argv: Optional[list] = None) -> None:
    flags = parse_flags(list(sys.argv[1:] if argv is None else argv))
    if not flags.semi_persistent_directory:
        flags = BootFlags(flags.worker_id, flags.provision_endpoint, flags.control_endpoint, flags.logging_endpoint,
                          tempfile.mkdtemp(prefix="beam-sdk-"))
    env = worker_environment(flags, provision_info(flags), os.environ)
    os.execve(sys.executable, [sys.executable, "-m", "apache_beam.runners.worker.sdk_worker_main"], env)


if __name__ == "__main__":
    main()
