"""Beam options for SparkRunner / FlinkRunner checked before the job is built: nothing is fetched at run time and a
missing jar, Java or engine is one line naming the make target (runners.preflight calls this).

Without `--spark_job_server_jar` / `--flink_job_server_jar` (and no `--job_endpoint`), Beam's Python SDK would
download a job-server jar from Maven Central when the job starts (apache_beam/runners/portability/job_server.py,
JavaJarJobServer.path_to_beam_jar); pileprep refuses that instead: `make spark` / `make flink` fetch the engines once
and `make spark-cluster` / `make flink-cluster` print the options that use them.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
import zipfile
from typing import Optional

from pipeline.errors import ConfigError

JAR_FLAG = {"SparkRunner": "spark_job_server_jar", "FlinkRunner": "flink_job_server_jar"}
LOCAL_MASTERS = ("[auto]", "[local]")
# What Spark's SparkContext accepts as a master (SparkContext.createTaskScheduler); anything else fails only after
# the job server has started (`Could not parse Master URL`). Beam's own default is local[4].
SPARK_MASTER = re.compile(r"^(local(\[[0-9*]+(,[0-9]+)?\])?|local-cluster\[[0-9, ]+\]|yarn|"
                          r"spark://[^/\s]+|k8s://\S+|mesos://\S+)$")
SPARK_LOCAL = re.compile(r"^local(\[.+\])?$")  # apache_beam/runners/portability/spark_runner.py LOCAL_MASTER_PATTERN
DOCKER_CHECK_TIMEOUT_S = 10.0
FLINK_CHECK_TIMEOUT_S = 10.0


def runner_class(runner: str) -> str:
    """The class name Beam runs for `--runner`: Beam takes a name in any case, with or without 'Runner'
    (apache_beam/runners/runner.py create_runner; pipeline/options.py import_runner accepts the same), so
    `--runner=spark` is SparkRunner and gets SparkRunner's checks."""
    from apache_beam.runners import runner as beam_runner  # noqa: PLC0415

    name = str(runner or "")
    known = beam_runner._RUNNER_MAP  # noqa: SLF001 - the map Beam itself resolves --runner with
    return known.get(name.lower(), known.get(name.lower() + "runner", name)).rsplit(".", 1)[-1]


def engine_of(runner: str) -> Optional[str]:
    return {"SparkRunner": "spark", "FlinkRunner": "flink"}.get(runner_class(runner))


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
        flag = JAR_FLAG[runner_class(runner)]
        jar = options.get(flag)
        if not jar:
            raise ConfigError(f"--runner={runner} needs --{flag}=PATH (Beam would fetch a job server from Maven "
                              f"at run time): run `{make}` once; `{make}-cluster` prints the options")
        if not os.path.isfile(jar):
            raise ConfigError(f"--{flag}={jar}: no such file; run `{make}` (it fetches the job server)")
        if not zipfile.is_zipfile(jar):  # else `java -jar` fails three times deep in Beam's job-server start-up
            raise ConfigError(f"--{flag}={jar}: not a jar; run `{make}` (it fetches the job server) and pass "
                              f"the jar `{make}-cluster` prints")
        launcher = options.get("job_server_java_launcher") or "java"
        if shutil.which(launcher) is None:
            raise ConfigError(f"--runner={runner}: no `{launcher}` to start the job server; install OpenJDK 17, "
                              f"then `{make}`")
    if engine == "spark":
        master = str(options.get("spark_master_url") or "local[4]")
        if not SPARK_MASTER.match(master):
            raise ConfigError(f"--spark_master_url={master}: not a Spark master URL (spark://HOST:PORT, local[N], "
                              "yarn, k8s://...); `make spark-cluster` prints one")
        if master.startswith("spark://"):  # spark://H1:P1,H2:P2: standalone masters with ZooKeeper recovery
            checks += [("--spark_master_url", f"spark://{one}", "the Spark master (make spark-cluster)")
                       for one in master[len("spark://"):].split(",")]
    else:
        master = str(options.get("flink_master") or "[auto]")
        if master not in LOCAL_MASTERS:
            _refuse_what_is_not_flink(master)
            checks.append(("--flink_master", master, "the Flink JobManager (make flink-cluster)"))
    if environment(options, engine) == "DOCKER":
        _require_docker(runner, make)
    return checks


def environment(options: dict, engine: str) -> str:
    """The SDK environment a Spark/Flink job would get: the given --environment_type, else Beam's default
    (apache_beam/runners/portability/spark_runner.py, flink_runner.py `default_environment`: LOOPBACK for a local
    master, DOCKER for a cluster)."""
    given = str(options.get("environment_type") or "").upper()
    if given:
        return given
    if engine == "spark":
        local = bool(SPARK_LOCAL.match(str(options.get("spark_master_url") or "local[4]")))
    else:
        local = str(options.get("flink_master") or "[auto]") in LOCAL_MASTERS
    return "LOOPBACK" if local else "DOCKER"


def _require_docker(runner: str, make: str) -> None:
    """A DOCKER environment needs a Docker daemon on every worker; without one on the driver's machine the job
    fails only once an executor runs `docker run` (after the job server and the stages have started)."""
    docker = shutil.which("docker")
    try:
        ok = docker is not None and subprocess.run(
            [docker, "version", "--format", "{{.Server.Version}}"], capture_output=True,
            timeout=DOCKER_CHECK_TIMEOUT_S, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        raise ConfigError(f"--runner={runner} with --environment_type=DOCKER (Beam's default for a cluster master) "
                          f"needs a Docker daemon and none answers here; use the PROCESS environment "
                          f"`{make}-cluster` prints (--environment_type=PROCESS "
                          "--environment_options=process_command=...)")


def _refuse_what_is_not_flink(master: str) -> None:
    """ConfigError when something answers at `master` but not as a Flink JobManager's REST API (GET /config names
    its flink-version): the job would start and fail minutes later (`Channel became inactive`, no flag named).
    Nothing answering, or an answer too slow, is left to the preflight's connect (pipeline/ops/runners.py)."""
    base = master if "://" in master else f"http://{master}"
    try:
        with urllib.request.urlopen(f"{base.rstrip('/')}/config", timeout=FLINK_CHECK_TIMEOUT_S) as r:  # noqa: S310
            if json.loads(r.read()).get("flink-version"):
                return
    except urllib.error.HTTPError:
        pass  # a web server, not Flink's REST API
    except urllib.error.URLError:
        return  # not reached (refused, no route, no such host)
    except (TimeoutError, socket.timeout):
        return
    except (http.client.HTTPException, ConnectionError, ValueError, AttributeError):
        pass  # answered, then closed or said something else
    raise ConfigError(f"--flink_master={master}: something answers there, but not a Flink JobManager (its REST "
                      "port, GET /config); `make flink-cluster` prints the address")
