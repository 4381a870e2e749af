"""Beam options for SparkRunner / FlinkRunner checked before the job is built: nothing is fetched at run time and a
missing jar, Java or engine is one line naming the make target (runners.preflight calls this).

Without `--spark_job_server_jar` / `--flink_job_server_jar` (and no `--job_endpoint`), Beam's Python SDK would
download a job-server jar from Maven Central when the job starts (apache_beam/runners/portability/job_server.py,
JavaJarJobServer.path_to_beam_jar); pileprep refuses that instead: `make spark` / `make flink` fetch the engines once
and `make spark-cluster` / `make flink-cluster` print the options that use them.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Optional

from pipeline.errors import ConfigError

JAR_FLAG = {"SparkRunner": "spark_job_server_jar", "FlinkRunner": "flink_job_server_jar"}
LOCAL_MASTERS = ("[auto]", "[local]")


def engine_of(runner: str) -> Optional[str]:
    name = str(runner or "").rsplit(".", 1)[-1]
    return {"SparkRunner": "spark", "FlinkRunner": "flink"}.get(name)


def process_command(options: dict) -> Optional[str]:
    """The PROCESS environment's command: `--environment_options=process_command=...` or the JSON config's."""
    for item in options.get("environment_options") or []:
        if str(item).startswith("process_command="):
            return str(item).split("=", 1)[1]
    config = options.get("environment_config")
    if config:
        try:
            return json.loads(config).get("command")
        except (ValueError, AttributeError):
            raise ConfigError(f"--environment_config={config}: PROCESS needs JSON {{\"command\": PATH}} "
                              "or --environment_options=process_command=PATH") from None
    return None


def check_engine_options(options: dict) -> list:
    """ConfigError for what cannot work; else the (flag, address, what) endpoints that must answer."""
    runner = str(options.get("runner") or "")
    engine = engine_of(runner)
    checks = []
    if str(options.get("environment_type") or "").upper() == "PROCESS":
        command = process_command(options)
        if not command:
            raise ConfigError("--environment_type=PROCESS needs --environment_options=process_command=PATH "
                              "(make spark-cluster / make flink-cluster print one)")
        if not (os.path.isfile(command) and os.access(command, os.X_OK)):
            raise ConfigError(f"--environment_options=process_command={command}: not an executable file "
                              "(make spark-cluster / make flink-cluster write one)")
    if engine is None:
        return checks
    make = f"make {engine}"
    endpoint = options.get("job_endpoint")
    if not endpoint or endpoint == "embed":
        flag = JAR_FLAG[runner.rsplit(".", 1)[-1]]
        jar = options.get(flag)
        if not jar:
            raise ConfigError(f"--runner={runner} needs --{flag}=PATH (Beam would fetch a job server from Maven "
                              f"at run time): run `{make}` once; `{make}-cluster` prints the options")
        if not os.path.isfile(jar):
            raise ConfigError(f"--{flag}={jar}: no such file; run `{make}` (it fetches the job server)")
        launcher = options.get("job_server_java_launcher") or "java"
        if shutil.which(launcher) is None:
            raise ConfigError(f"--runner={runner}: no `{launcher}` to start the job server; install OpenJDK 17, "
                              f"then `{make}`")
    if engine == "spark":
        master = str(options.get("spark_master_url") or "")
        if master.startswith("spark://"):
            checks.append(("--spark_master_url", master, "the Spark master (make spark-cluster)"))
    else:
        master = str(options.get("flink_master") or "[auto]")
        if master not in LOCAL_MASTERS:
            checks.append(("--flink_master", master, "the Flink JobManager (make flink-cluster)"))
    return checks
