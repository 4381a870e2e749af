"""`make spark-cluster` / `make flink-cluster`: a real local cluster in the background, and its Beam options.

    python -m pipeline.ops.engines.cluster start spark|flink --state-dir DIR
    python -m pipeline.ops.engines.cluster stop --state-dir DIR

Spark: a standalone Master and two Workers (1 core, 1 GiB each), separate JVMs on 127.0.0.1, from the fetched
pyspark distribution (`spark-class`). Flink: a JobManager (StandaloneSessionClusterEntrypoint) and a TaskManager
(2 slots) from the fetched flink-dist, each its own JVM. Python SDK workers are processes the executors start
(`--environment_type=PROCESS`) through DIR/sdk-worker, which runs this interpreter's pileprep
(pipeline/ops/engines/sdk_boot.py): no Docker image, no install at run time.

`start` ends with two lines, `MASTER_URL=...` and `BEAM_ARGS=...` (space-separated `--key=value`, no quotes or
spaces inside values). DIR/cluster.json records what was started (pid and its start time); `stop` ends those
processes' groups and nothing else (a pid reused by another program does not match its recorded start time).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from pipeline.ops.engines import fetch

READY_TIMEOUT_S = 120.0
JOB_SERVER_HEAP = "-Xmx768m"
# Python SDK workers are processes; without a cache the runner closes a stage's workers when the stage ends and the
# next stage waits for new ones to import Beam and pileprep (measured: docs/OPERATIONS.md, "Spark and Flink").
PROCESS_ARGS = ["--environment_type=PROCESS", "--environment_cache_millis=60000"]
SPARK_EXCLUDE_ARGS = ["--job_server_jvm_properties=-Dspark.excludeOnFailure.enabled=true",
                      "--job_server_jvm_properties=-Dspark.excludeOnFailure.killExcludedExecutors=true"]


@dataclass
class Cluster:
    engine: str
    master_url: str
    beam_args: list[str]
    state_dir: str
    processes: list[dict[str, Any]] = field(default_factory=list)  # [{"name", "pid", "start"}]

    def lines(self) -> str:
        return f"MASTER_URL={self.master_url}\nBEAM_ARGS={' '.join(self.beam_args)}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stat(pid: int) -> tuple:
    """(state, start time) from /proc/PID/stat, or (None, None)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return fields[0], fields[19]
    except (OSError, IndexError):
        return None, None


def _recorded(p: dict) -> bool:
    """The pid is still the process recorded (its start time matches), running or exited but not yet reaped: its
    process group (the executors, the SDK workers) may outlive it."""
    return bool(p.get("start")) and _stat(p["pid"])[1] == p["start"]


def _alive(p: dict) -> bool:
    """The process recorded, not exited: a child of this process that exited stays a zombie, with its /proc entry
    and start time, until reaped (`_reap`)."""
    return _recorded(p) and _stat(p["pid"])[0] not in ("Z", "X")


def _reap(processes: list) -> None:
    for p in processes:
        try:
            os.waitpid(p["pid"], os.WNOHANG)
        except ChildProcessError:  # not this process's child (`stop` from another make run): init reaps it
            pass


def _log_tail(log: pathlib.Path, lines: int = 4) -> str:
    """The log's last lines as one line (the make target's error is one line)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return " | ".join(ln.strip() for ln in text.strip().splitlines()[-lines:])[-600:]


# The state directories this process has started something from: only those does an interrupted start stop
# (`main`); an interrupt before that must not stop a cluster an earlier start left running there.
_SPAWNED_FROM: set = set()


def _spawn(name: str, argv: list, state: pathlib.Path, env: dict) -> dict:
    _SPAWNED_FROM.add(state)
    log = open(state / f"{name}.log", "ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            cwd=str(state), start_new_session=True)
    log.close()
    return {"name": name, "pid": proc.pid, "start": _stat(proc.pid)[1]}


def _write_json(path: pathlib.Path, data: dict) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def sdk_worker_script(state: pathlib.Path) -> pathlib.Path:
    """DIR/sdk-worker: the PROCESS environment's command, this interpreter's sdk_boot (written atomically)."""
    path = state / "sdk-worker"
    tmp = state / f".sdk-worker.tmp-{os.getpid()}"
    tmp.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m pipeline.ops.engines.sdk_boot "$@"\n')
    tmp.chmod(0o755)
    os.replace(tmp, path)
    return path


# The job server's JVM ends with the driver process (SIGTERM when it dies: PR_SET_PDEATHSIG, util-linux setpriv
# >= 2.33). In a session of its own nothing else reaches it once the driver is SIGKILLed (alone or with its process
# group, as a scheduler's timeout does): it kept running the job, committed the dataset under the dead driver's
# lock, and stayed, with its job port open on every interface, until killed by hand. SPARK_LOCAL_IP: the Spark
# driver inside the job server binds its web UI (with its stage kill links) to every interface without it.
JOB_SERVER_JAVA = """#!/bin/sh
export SPARK_LOCAL_IP=127.0.0.1
if setpriv --pdeathsig TERM true 2>/dev/null; then exec setsid setpriv --pdeathsig TERM java "$@"; fi
exec setsid java "$@"
"""


def job_server_java(state: pathlib.Path) -> pathlib.Path:
    """DIR/job-server-java: `--job_server_java_launcher`, java in a session of its own that ends with the driver
    (JOB_SERVER_JAVA). Beam starts the job server in the driver's process group
    (apache_beam/utils/subprocess_server.py), so a terminal's Ctrl-C would end it before the driver could cancel
    the job through it (pipeline/ops/engines/submit.py); Beam still stops it (SIGINT to its pid)."""
    path = state / "job-server-java"
    tmp = state / f".job-server-java.tmp-{os.getpid()}"
    tmp.write_text(JOB_SERVER_JAVA)
    tmp.chmod(0o755)
    os.replace(tmp, path)
    return path


def _get_json(url: str) -> Optional[dict]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:  # noqa: S310 - a loopback URL this module built
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def _wait(ready, cluster: Cluster, what: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        for p in cluster.processes:
            if not _alive(p):
                tail = _log_tail(pathlib.Path(cluster.state_dir) / f"{p['name']}.log")
                stop(pathlib.Path(cluster.state_dir))
                raise fetch.EngineSetupError(f"{cluster.engine}: {p['name']} exited during start-up: {tail}")
        if ready():
            return
        time.sleep(0.5)
    stop(pathlib.Path(cluster.state_dir))
    raise fetch.EngineSetupError(f"{cluster.engine}: {what} not ready within {READY_TIMEOUT_S:.0f}s "
                                 f"(logs in {cluster.state_dir})")


def _prepare(state: pathlib.Path, engine: str) -> None:
    state.mkdir(parents=True, exist_ok=True)
    # A start writes its logs, the Flink configuration and the workers' directories in DIR and DIR/conf by name:
    # a link there would have it append to, overwrite or fill whatever the link names.
    conf = state / "conf"
    entries = [*state.iterdir(), *(conf.iterdir() if conf.is_dir() and not conf.is_symlink() else [])]
    links = sorted(str(e.relative_to(state)) for e in entries if e.is_symlink())
    if links:
        raise fetch.EngineSetupError(f"{state} holds links ({', '.join(links)}); a start never follows one: remove "
                                     "them or give another --state-dir")
    if (state / "cluster.json").exists():
        old = json.loads((state / "cluster.json").read_text())
        if any(_alive(p) for p in old.get("processes", [])):
            raise fetch.EngineSetupError(f"a cluster started from {state} is still running; stop it first "
                                         f"(make {old.get('engine', 'spark')}-cluster-stop)")
    elif any(state.iterdir()):
        # Not a directory an earlier start made (its first write is cluster.json): the start would overwrite
        # conf/flink-conf.yaml, sdk-worker, ... of whatever lives there (ENGINES_STATE=/opt/flink).
        raise fetch.EngineSetupError(f"{state} holds files no cluster start made; give an empty or new --state-dir "
                                     "(make: ENGINES_STATE=DIR)")
    _write_json(state / "cluster.json", {"engine": engine, "state_dir": str(state), "processes": []})


def start_spark(state: pathlib.Path, env: Optional[dict] = None, workers: int = 2) -> Cluster:
    pins = fetch.require("spark")
    _prepare(state, "spark")
    home = fetch.engine_home(pins)
    port, ui = free_port(), free_port()
    env = dict(env or os.environ)
    env.update(SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1", SPARK_DAEMON_MEMORY="256m",
               SPARK_LOG_DIR=str(state), SPARK_CONF_DIR=str(state))
    master_url = f"spark://127.0.0.1:{port}"
    script = sdk_worker_script(state)
    events = state / "events"
    events.mkdir(exist_ok=True)
    cluster = Cluster("spark", master_url, [
        "--runner=SparkRunner", f"--spark_master_url={master_url}",
        f"--spark_job_server_jar={fetch.launcher_jar(pins)}", f"--job_server_jvm_properties={JOB_SERVER_HEAP}",
        # The job server hosts Spark's driver: on the loopback like the cluster (else it binds the host's address).
        "--job_server_jvm_properties=-Dspark.driver.host=127.0.0.1",
        "--job_server_jvm_properties=-Dspark.driver.bindAddress=127.0.0.1",
        # Spark's event log, as EMR keeps one for its history server (what the tests read for secrets).
        "--job_server_jvm_properties=-Dspark.eventLog.enabled=true",
        f"--job_server_jvm_properties=-Dspark.eventLog.dir=file://{events}",
        # A lost SDK worker: an executor keeps its job's SDK workers (Beam's Spark runner releases them only
        # asynchronously, --environment_cache_millis after the last task: SparkExecutableStageContextFactory) and
        # never checks that one is alive (DefaultJobBundleFactory), so every retry Spark makes on that executor
        # fails at once and spark.task.maxFailures ends the job. Excluding the executor after a failed task
        # sends the retry to another one, and killing it has the master start a fresh executor with fresh SDK
        # workers (tests/e2e/test_engines_spark.py; docs/OPERATIONS.md "Spark and Flink").
        *SPARK_EXCLUDE_ARGS,
        f"--job_server_java_launcher={job_server_java(state)}",
        *PROCESS_ARGS, f"--environment_options=process_command={script}"], str(state))
    spark_class = str(home / "bin" / "spark-class")
    cluster.processes.append(_spawn("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host",
                                               "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
                                    state, env))
    _write_json(state / "cluster.json", asdict(cluster))
    for i in range(workers):
        work = state / f"work{i}"
        work.mkdir(exist_ok=True)
        cluster.processes.append(_spawn(f"worker{i}", [spark_class, "org.apache.spark.deploy.worker.Worker",
                                                       "--host", "127.0.0.1", "--cores", "1", "--memory", "1g",
                                                       "--webui-port", "0", "--work-dir", str(work), master_url],
                                        state, env))
        _write_json(state / "cluster.json", asdict(cluster))

    def ready() -> bool:
        info = _get_json(f"http://127.0.0.1:{ui}/json/")
        return bool(info) and int(info.get("aliveworkers", 0)) >= workers

    _wait(ready, cluster, f"the master and {workers} workers")
    return cluster


# The TaskManager's heap and direct memory hold the runner shuffle's data as it crosses the data plane: a
# GroupByKey's output is one element per shard (its every piece), so they grow with the shard, not the corpus
# (docs/OPERATIONS.md). At 1280m (heap ~300 MB, no task off-heap) the 384 MB bench corpus in 4 shards ran the heap
# out in a gRPC thread, which Flink only logs by default: the job then hung, RUNNING, with no failure to restart;
# at 2048m, 16 shards ran out of direct memory in the pack stage. Hence task off-heap for the data plane's
# buffers and a smaller managed pool (Flink's sorter; the task heap is ~670 MB at 2560m). FAIL / exit-on-oom end
# an out-of-memory TaskManager instead, so the job fails (one line) rather than hangs.
FLINK_CONF = """\
jobmanager.rpc.address: 127.0.0.1
jobmanager.bind-host: 127.0.0.1
jobmanager.rpc.port: {rpc}
rest.address: 127.0.0.1
rest.bind-address: 127.0.0.1
rest.port: {rest}
taskmanager.host: 127.0.0.1
taskmanager.bind-host: 127.0.0.1
taskmanager.numberOfTaskSlots: 2
parallelism.default: 2
jobmanager.memory.process.size: 768m
taskmanager.memory.process.size: 2560m
taskmanager.memory.task.off-heap.size: 512m
taskmanager.memory.managed.fraction: 0.2
cluster.uncaught-exception-handling: FAIL
taskmanager.jvm-exit-on-oom: true
restart-strategy.type: fixed-delay
restart-strategy.fixed-delay.attempts: 2
restart-strategy.fixed-delay.delay: 1 s
"""


def _flink_tm_params(home: pathlib.Path, conf: pathlib.Path, env: dict) -> tuple:
    """The TaskManager's JVM options and dynamic properties, as Flink's own taskmanager.sh gets them (BashJavaUtils
    turns taskmanager.memory.process.size into the memory pools the TaskManager insists on being given)."""
    cp = f"{home / 'lib'}/*:{home / 'bin' / 'bash-java-utils.jar'}"
    res = subprocess.run(["java", "-cp", cp, "org.apache.flink.runtime.util.bash.BashJavaUtils",
                          "GET_TM_RESOURCE_PARAMS", "--configDir", str(conf)], capture_output=True, text=True,
                         env=env, check=False, timeout=120)
    lines = [ln.split(":", 1)[1] for ln in res.stdout.splitlines() if ln.startswith("BASH_JAVA_UTILS_EXEC_RESULT:")]
    if res.returncode != 0 or len(lines) < 2:
        raise fetch.EngineSetupError(f"flink: BashJavaUtils failed: {(res.stderr or res.stdout)[-500:]}")
    return lines[0].split(), lines[1].split()


def start_flink(state: pathlib.Path, env: Optional[dict] = None) -> Cluster:
    pins = fetch.require("flink")
    _prepare(state, "flink")
    home = fetch.engine_home(pins)
    rpc, rest = free_port(), free_port()
    conf = state / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "flink-conf.yaml").write_text(FLINK_CONF.format(rpc=rpc, rest=rest))
    env = dict(env or os.environ)
    master = f"127.0.0.1:{rest}"
    script = sdk_worker_script(state)
    cluster = Cluster("flink", master, [
        "--runner=FlinkRunner", f"--flink_master={master}", f"--flink_job_server_jar={fetch.launcher_jar(pins)}",
        f"--job_server_jvm_properties={JOB_SERVER_HEAP}", f"--job_server_java_launcher={job_server_java(state)}",
        *PROCESS_ARGS,
        f"--environment_options=process_command={script}"], str(state))
    cp = f"{home / 'lib'}/*"
    jm = ["java", "-Xmx256m", *fetch.JVM_OPENS, f"-Dlog.file={state / 'jobmanager.flink.log'}", "-cp", cp,
          "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint", "--configDir", str(conf)]
    cluster.processes.append(_spawn("jobmanager", jm, state, env))
    _write_json(state / "cluster.json", asdict(cluster))
    jvm, dynamic = _flink_tm_params(home, conf, env)
    tm = ["java", *jvm, *fetch.JVM_OPENS, f"-Dlog.file={state / 'taskmanager.flink.log'}", "-cp", cp,
          "org.apache.flink.runtime.taskexecutor.TaskManagerRunner", "--configDir", str(conf), *dynamic]
    cluster.processes.append(_spawn("taskmanager", tm, state, env))
    _write_json(state / "cluster.json", asdict(cluster))

    def ready() -> bool:
        info = _get_json(f"http://{master}/overview")
        return bool(info) and int(info.get("taskmanagers", 0)) >= 1

    _wait(ready, cluster, "the JobManager and its TaskManager")
    return cluster


def stop(state: pathlib.Path, grace_s: float = 3.0) -> int:
    """End the process groups recorded in DIR/cluster.json whose leaders are still the processes started (pid and
    start time match); returns how many were."""
    try:
        record = json.loads((state / "cluster.json").read_text())
    except (OSError, ValueError):
        return 0
    live = [p for p in record.get("processes", []) if _recorded(p)]
    for p in live:
        try:
            os.killpg(p["pid"], signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in live):
        _reap(live)
        time.sleep(0.2)
    for p in live:
        if _recorded(p):
            try:
                os.killpg(p["pid"], signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    return len(live)


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.ops.engines.cluster")
    ap.add_argument("action", choices=("start", "stop"))
    ap.add_argument("engine", nargs="?", choices=fetch.ENGINES)
    ap.add_argument("--state-dir", required=True)
    a = ap.parse_args(argv)
    state = pathlib.Path(a.state_dir).resolve()
    try:
        if a.action == "stop":
            n = stop(state)
            fetch.say(f"stopped {n} process group(s) started from {state}")
            return 0
        if a.engine is None:
            raise fetch.EngineSetupError("start needs the engine: spark or flink")
        cluster = (start_spark if a.engine == "spark" else start_flink)(state)
    except fetch.EngineSetupError as e:
        fetch.say(str(e), error=True)
        return 2
    except KeyboardInterrupt:  # the JVMs are in sessions of their own: Ctrl-C reaches only this process
        if a.action == "start":
            n = stop(state) if state in _SPAWNED_FROM else 0
            fetch.say(f"start interrupted; stopped the {n} process group(s) it had started from {state}", error=True)
        else:
            fetch.say(f"stop interrupted; run it again (--state-dir {state})", error=True)
        return 130
    fetch.say(cluster.lines())
    return 0


if __name__ == "__main__":
    sys.exit(main())
