"""Spark/Flink option checks, the engines' pins and launcher jar, and the PROCESS boot's environment (no JVM)."""
from __future__ import annotations

import json
import os
import time
import zipfile

import pytest

from pipeline.errors import ConfigError
from pipeline.ops import runners
from pipeline.ops.engines import fetch, sdk_boot
from pipeline.ops.engines.options import check_engine_options
from tests.ops_fixtures import free_port


def _exe(tmp_path):
    script = tmp_path / "sdk-worker"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    return str(script)


def _jar(tmp_path):
    """A (empty) jar: a zip file, as the option check requires."""
    jar = tmp_path / "j.jar"
    zipfile.ZipFile(jar, "w").close()
    return jar


def test_spark_runner_without_a_job_server_jar_is_refused_naming_make_spark():
    with pytest.raises(ConfigError, match=r"--spark_job_server_jar.*make spark"):
        check_engine_options({"runner": "SparkRunner", "spark_master_url": "local[4]"})


def test_missing_jar_is_refused_naming_the_make_target(tmp_path):
    with pytest.raises(ConfigError, match=r"no such file.*make flink"):
        check_engine_options({"runner": "FlinkRunner", "flink_job_server_jar": str(tmp_path / "none.jar")})


def test_missing_java_is_refused(tmp_path):
    jar = _jar(tmp_path)
    with pytest.raises(ConfigError, match=r"install OpenJDK 17.*make spark"):
        check_engine_options({"runner": "SparkRunner", "spark_job_server_jar": str(jar),
                              "job_server_java_launcher": str(tmp_path / "no-java")})


def test_a_given_job_endpoint_needs_no_jar_and_masters_are_checked(tmp_path):
    checks = check_engine_options({"runner": "SparkRunner", "job_endpoint": "localhost:8099",
                                   "spark_master_url": "spark://127.0.0.1:7077", "environment_type": "PROCESS",
                                   "environment_options": [f"process_command={_exe(tmp_path)}"]})
    assert [c[0] for c in checks] == ["--spark_master_url"]
    assert check_engine_options({"runner": "FlinkRunner", "job_endpoint": "x:1", "flink_master": "[auto]"}) == []


def test_process_environment_needs_an_executable_command(tmp_path):
    with pytest.raises(ConfigError, match="process_command=PATH"):
        check_engine_options({"environment_type": "PROCESS"})
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(ConfigError, match="not an executable file"):
        check_engine_options({"environment_type": "PROCESS", "environment_options": [f"process_command={plain}"]})
    assert check_engine_options({"environment_type": "PROCESS",
                                 "environment_config": json.dumps({"command": _exe(tmp_path)})}) == []


def test_preflight_names_an_unreachable_spark_master(tmp_path):
    jar = _jar(tmp_path)
    port = free_port()
    with pytest.raises(ConfigError, match=r"--spark_master_url=spark://127.0.0.1:\d+: nothing answers"):
        runners.preflight({"runner": "SparkRunner", "spark_job_server_jar": str(jar),
                           "job_server_java_launcher": "sh", "spark_master_url": f"spark://127.0.0.1:{port}",
                           "environment_type": "PROCESS", "environment_options": [f"process_command={_exe(tmp_path)}"]})


def test_pins_come_from_pyproject_and_key_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("PILEPREP_ENGINES_CACHE", str(tmp_path))
    spark, flink = fetch.load_pins("spark"), fetch.load_pins("flink")
    assert spark.runner.startswith("org.apache.beam:beam-runners-spark-3:")
    assert flink.dist_package == "apache-flink-libraries"
    assert fetch.engine_dir(spark).parent == tmp_path and spark.digest() in fetch.engine_dir(spark).name
    assert not fetch.is_complete(spark)
    with pytest.raises(fetch.EngineSetupError, match="make spark"):
        fetch.require("spark")


def test_pom_swaps_the_job_service_for_the_served_one():
    pom = fetch.pom_xml(fetch.load_pins("spark"))
    assert pom.count("beam-runners-java-job-service") == 2  # excluded from the runner, then pinned without deps
    assert "<artifactId>*</artifactId>" in pom


def test_launcher_manifest_lines_fit_72_bytes_and_name_every_jar(tmp_path):
    jars = [f"lib/some-long-artifact-name-{i}-1.2.3.jar" for i in range(40)] + ["dist/pyspark/jars/é-1.jar"]
    jar = tmp_path / "l.jar"
    fetch.write_launcher(jar, "a.b.Main", jars)
    text = zipfile.ZipFile(jar).read("META-INF/MANIFEST.MF")
    assert all(len(line) <= 72 for line in text.split(b"\r\n"))
    unfolded = text.decode().replace("\r\n ", "")
    class_path = next(ln for ln in unfolded.split("\r\n") if ln.startswith("Class-Path: "))
    assert class_path.split(" ")[1:] == jars
    assert "Main-Class: a.b.Main" in unfolded and "java.base/sun.nio.ch" in unfolded


def test_boot_environment_carries_options_and_endpoints():
    from apache_beam.portability.api import beam_provision_api_pb2

    info = beam_provision_api_pb2.ProvisionInfo()
    info.pipeline_options.update({"beam:option:job_name:v1": "j"})
    info.control_endpoint.url = "localhost:1"
    info.runner_capabilities.append("beam:protocol:x")
    flags = sdk_boot.parse_flags(["--id=w1", "--provision_endpoint=localhost:2", "--logging_endpoint=localhost:3"])
    env = sdk_boot.worker_environment(flags, info, {"PATH": os.environ.get("PATH", "")})
    assert env["WORKER_ID"] == "w1" and env["CONTROL_API_SERVICE_DESCRIPTOR"] == 'url: "localhost:1"'
    assert env["LOGGING_API_SERVICE_DESCRIPTOR"] == 'url: "localhost:3"'
    assert json.loads(env["PIPELINE_OPTIONS"]) == {"beam:option:job_name:v1": "j"}
    assert env["RUNNER_CAPABILITIES"] == "beam:protocol:x"


def test_a_job_service_runner_gets_no_s3_secret_and_other_runners_keep_theirs():
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.ops.engines import submit

    args = ["--runner=FlinkRunner", "--flink_master=127.0.0.1:8081", "--s3_access_key_id=AKID",
            "--s3_secret_access_key=SECRET", "--s3_session_token=TOKEN", "--s3_endpoint_url=http://127.0.0.1:9",
            "--environment_type=PROCESS", "--environment_options=process_command=/x", "--experiments=a",
            "--experiments=b"]
    sent = submit.for_submission(PipelineOptions(args)).get_all_options(drop_default=True,
                                                                        retain_unknown_options=True)
    assert not {"s3_access_key_id", "s3_secret_access_key", "s3_session_token"} & {k for k, v in sent.items() if v}
    assert sent["s3_endpoint_url"] == "http://127.0.0.1:9" and sent["experiments"] == ["a", "b"]
    assert sent["environment_options"] == ["process_command=/x"] and sent["flink_master"] == "127.0.0.1:8081"
    local = PipelineOptions(["--runner=DirectRunner", "--s3_secret_access_key=SECRET"])
    assert submit.for_submission(local) is local
    assert sent["job_name"].startswith("pileprep-")


def test_the_pipeline_built_for_a_job_service_leaves_the_drivers_filesystems_their_credentials():
    """Beam's Pipeline() hands its options, here the secret-less copy, to this process's filesystems; the driver
    still reads and cleans its S3 staging after the job (pipeline/ops/engines/submit.py `pipeline`)."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.ops.engines import submit
    from transforms.io.filesystem_options import filesystem_options, set_filesystem_options

    options = PipelineOptions(["--runner=PortableRunner", "--job_endpoint=localhost:1", "--s3_access_key_id=AKID",
                               "--s3_secret_access_key=SECRET", "--s3_endpoint_url=http://127.0.0.1:9"])
    try:
        p = submit.pipeline(options)
        assert not p.options.get_all_options(drop_default=True).get("s3_secret_access_key")  # not sent
        given = FileSystems._pipeline_options.get_all_options(drop_default=True)  # what Beam's S3 client reads
        assert given["s3_secret_access_key"] == "SECRET" and given["s3_access_key_id"] == "AKID"
        assert filesystem_options()["s3_secret_access_key"] == "SECRET"
    finally:
        set_filesystem_options(PipelineOptions([]))


def test_final_counters_take_the_markers_count_over_attempted_metrics():
    from pipeline.ops import progress

    # Spark recomputes a stage two stages read: its attempted metrics count those records twice.
    assert progress.final_counters({"records": 230, "shuffle_pieces": 4}, {"records": 172, "examples": 0}) == \
        {"records": 172, "shuffle_pieces": 4, "examples": 0}
    assert progress.final_counters({"examples": 9}, {"examples": 0, "records": 3}) == {"examples": 9, "records": 3}


def _ctrl_c_while_waiting(cancel_body) -> list:
    """SIGINT while submit.wait_or_cancel waits on a job-service result whose Cancel runs `cancel_body(calls)`;
    KeyboardInterrupt must come out. Returns what was called: Cancel's entries, and "beam stops the job server" if
    Beam's own SIGINT handler (the one installed before the wait) ran."""
    import signal
    import threading

    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.portability.api import beam_job_api_pb2
    from apache_beam.runners.portability import portable_runner

    from pipeline.ops.engines import submit

    calls, ended = [], threading.Event()

    class JobService:
        def Cancel(self, request, timeout=None):  # noqa: N802 - the gRPC stub's name
            cancel_body(calls)
            ended.set()

    def states():
        yield beam_job_api_pb2.JobStateEvent(state=beam_job_api_pb2.JobState.RUNNING)
        ended.wait(10)
        yield beam_job_api_pb2.JobStateEvent(state=beam_job_api_pb2.JobState.CANCELLED)

    result = portable_runner.PipelineResult(JobService(), "j", iter([]), states())
    previous = signal.signal(signal.SIGINT, lambda *_: calls.append("beam stops the job server"))
    try:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            submit.wait_or_cancel(result, PipelineOptions([]), cancel_timeout_s=5)
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # Beam's handler is back
    finally:
        signal.signal(signal.SIGINT, previous)
    return calls


def test_ctrl_c_during_a_job_service_run_cancels_before_beams_handler_stops_the_job_server():
    """SIGINT while waiting: the job is cancelled through the job service first (Beam's own SIGINT handler, which
    stops the job server, is held back), then the interrupt goes on as KeyboardInterrupt."""
    assert _ctrl_c_while_waiting(lambda calls: calls.append("cancel")) == ["cancel"]


def test_every_job_builds_its_pipeline_through_submit_pipeline():
    """A job that built `beam.Pipeline(options=for_submission(...))` itself gave its driver the secret-less
    options: retrieval's store job did (pipeline/retrieval/store_job.py), as the shard job had before
    submit.pipeline. Only pipeline/ops/engines/submit.py may call for_submission."""
    import pathlib
    import re

    repo = pathlib.Path(__file__).resolve().parents[3]
    callers = [str(p.relative_to(repo)) for room in ("pipeline", "transforms", "trainer", "model_contract")
               for p in sorted((repo / room).rglob("*.py"))
               if re.search(r"\bfor_submission\(", p.read_text()) and p.name != "submit.py"]
    assert callers == []


# ------------------------------------------------------------------ review31: bad configurations fail before Beam


def test_a_job_server_jar_that_is_not_a_jar_is_refused(tmp_path):
    """A text file passed as the jar: `java -jar` failed three times inside Beam's job-server start-up (exit 1,
    a traceback from a gRPC thread) instead of one exit-2 line."""
    text = tmp_path / "beam-spark-job-server.jar"
    text.write_text("root:x:0:0\n")
    with pytest.raises(ConfigError, match=r"--spark_job_server_jar=.*: not a jar; run `make spark`"):
        check_engine_options({"runner": "SparkRunner", "spark_job_server_jar": str(text),
                              "job_server_java_launcher": "sh", "environment_type": "PROCESS",
                              "environment_options": [f"process_command={_exe(tmp_path)}"]})


@pytest.mark.parametrize("master", ["garbage", "spark:/127.0.0.1:7077", "127.0.0.1:7077", "local[x]", ""])
def test_a_spark_master_url_spark_cannot_parse_is_refused(tmp_path, master):
    """`--spark_master_url=garbage` reached Spark: `Could not parse Master URL` after the job server started."""
    options = {"runner": "SparkRunner", "job_endpoint": "127.0.0.1:1", "spark_master_url": master,
               "environment_type": "PROCESS", "environment_options": [f"process_command={_exe(tmp_path)}"]}
    if master == "":  # not given: Beam's default local[4]
        assert check_engine_options(options) == []
        return
    with pytest.raises(ConfigError, match=r"not a Spark master URL"):
        check_engine_options(options)


@pytest.mark.parametrize("master", ["local", "local[4]", "local[*]", "local[2,3]", "yarn", "k8s://https://h:443",
                                    "spark://127.0.0.1:7077"])
def test_spark_master_urls_spark_takes_pass(tmp_path, master):
    checks = check_engine_options({"runner": "SparkRunner", "job_endpoint": "127.0.0.1:1",
                                   "spark_master_url": master, "environment_type": "PROCESS",
                                   "environment_options": [f"process_command={_exe(tmp_path)}"]})
    assert [c[0] for c in checks] == (["--spark_master_url"] if master.startswith("spark://") else [])


@pytest.mark.parametrize("options", [
    {"runner": "SparkRunner", "spark_master_url": "spark://127.0.0.1:7077", "environment_type": "DOCKER"},
    {"runner": "SparkRunner", "spark_master_url": "spark://127.0.0.1:7077"},  # Beam's default for a cluster
    {"runner": "FlinkRunner", "flink_master": "127.0.0.1:8081"},
    {"runner": "FlinkRunner", "flink_master": "[local]", "environment_type": "docker"}])
def test_a_docker_environment_without_a_docker_daemon_is_refused(monkeypatch, tmp_path, options):
    """`--environment_type=DOCKER` (or none with a cluster master) where no Docker daemon answers: the job ran
    until an executor's `docker run` failed (exit 1, Beam's log); now exit 2 naming the PROCESS environment."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker here (a docker CLI without a daemon fails alike)
    with pytest.raises(ConfigError, match=r"needs a Docker daemon.*make (spark|flink)-cluster"):
        check_engine_options({**options, "job_endpoint": "127.0.0.1:1"})


def test_local_masters_default_to_loopback_and_need_no_docker(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert check_engine_options({"runner": "SparkRunner", "job_endpoint": "127.0.0.1:1"}) == []
    assert check_engine_options({"runner": "FlinkRunner", "job_endpoint": "127.0.0.1:1",
                                 "flink_master": "[auto]"}) == []


@pytest.mark.parametrize("runner", ["spark", "Spark", "sparkrunner", "SPARKRUNNER"])
def test_every_name_beam_takes_for_spark_gets_the_checks(runner):
    """Beam maps --runner case-insensitively, with or without 'Runner' (apache_beam/runners/runner.py, as
    pipeline/options.py import_runner does): `--runner=spark` ran SparkRunner past every check, and Beam went to
    fetch a job-server jar from Maven at run time."""
    with pytest.raises(ConfigError, match=r"--spark_job_server_jar.*make spark"):
        check_engine_options({"runner": runner, "spark_master_url": "local[4]"})


@pytest.mark.parametrize("runner", ["flink", "FLINK", "flinkrunner", "sparkrunner", "portablerunner"])
def test_every_name_beam_takes_for_a_job_service_runner_gets_no_s3_secret(runner):
    """`--runner=flink` is FlinkRunner to Beam: its options reached the job server, S3 keys included (Flink
    shows them as the job's configuration)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.ops.engines import submit

    sent = submit.for_submission(PipelineOptions([f"--runner={runner}", "--s3_access_key_id=AKID",
                                                  "--s3_secret_access_key=SECRET"]))
    given = sent.get_all_options(drop_default=True, retain_unknown_options=True)
    assert "s3_secret_access_key" not in given and "s3_access_key_id" not in given


def _flink_options(tmp_path, master: str) -> dict:
    return {"runner": "FlinkRunner", "job_endpoint": "127.0.0.1:1", "flink_master": master,
            "environment_type": "PROCESS", "environment_options": [f"process_command={_exe(tmp_path)}"]}


def test_a_flink_master_where_something_else_answers_is_refused(tmp_path):
    """--flink_master at a port that answers but is no JobManager (here a socket that closes, as Spark's master
    port does, and a web server): the job server started, submitted, and the job failed 70 s later with
    `Channel became inactive` (exit 1), naming no flag."""
    import http.server
    import socket
    import threading

    closer = socket.socket()
    closer.bind(("127.0.0.1", 0))
    closer.listen(4)
    closer.settimeout(0.1)
    done = threading.Event()

    def close_each():
        while not done.is_set():
            try:
                conn, _ = closer.accept()
            except OSError:
                continue
            conn.close()

    threads = [threading.Thread(target=close_each)]
    web = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threads.append(threading.Thread(target=web.serve_forever, kwargs={"poll_interval": 0.1}))
    for t in threads:
        t.start()
    try:
        for port in (closer.getsockname()[1], web.server_address[1]):
            with pytest.raises(ConfigError, match=r"--flink_master=127.0.0.1:\d+: .*not a Flink JobManager"):
                check_engine_options(_flink_options(tmp_path, f"127.0.0.1:{port}"))
    finally:
        done.set()
        web.shutdown()
        for t in threads:
            t.join()
        web.server_close()
        closer.close()


def test_a_flink_master_where_nothing_answers_is_left_to_the_preflights_connect(tmp_path):
    port = free_port()
    assert check_engine_options(_flink_options(tmp_path, f"127.0.0.1:{port}")) == \
        [("--flink_master", f"127.0.0.1:{port}", "the Flink JobManager (make flink-cluster)")]
    with pytest.raises(ConfigError, match="nothing answers"):
        runners.preflight(_flink_options(tmp_path, f"127.0.0.1:{port}"))


def test_a_spark_standalone_ha_master_url_checks_each_master(tmp_path):
    """spark://h1:p1,h2:p2 (standalone masters with ZooKeeper recovery) is a Spark master URL: it was refused as
    'nothing answers' (one connect to the host 'h1:p1,h2')."""
    checks = check_engine_options({"runner": "SparkRunner", "job_endpoint": "127.0.0.1:1",
                                   "spark_master_url": "spark://10.0.0.1:7077,10.0.0.2:7077",
                                   "environment_type": "PROCESS",
                                   "environment_options": [f"process_command={_exe(tmp_path)}"]})
    assert [(c[0], c[1]) for c in checks] == [("--spark_master_url", "spark://10.0.0.1:7077"),
                                              ("--spark_master_url", "spark://10.0.0.2:7077")]


def test_a_given_job_name_still_names_one_job_only():
    """Ctrl-C cancels the Flink jobs named as this run's (submit.cancel_on_flink). A given `--job_name` was sent
    as it was: two runs given one name (a scheduler's fixed name, a backfill) shared it, and Ctrl-C on one
    cancelled the other's job too. The name sent keeps the given one as its prefix and is this run's own."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.ops.engines import submit

    def sent_name():
        options = PipelineOptions(["--runner=FlinkRunner", "--job_name=nightly-shard"])
        return submit.for_submission(options).get_all_options()["job_name"]

    first, second = sent_name(), sent_name()
    assert first.startswith("nightly-shard-") and second.startswith("nightly-shard-") and first != second


def test_a_second_ctrl_c_does_not_cut_the_cancel_short():
    """Ctrl-C twice (an impatient operator): the second one, while the job was being cancelled, raised inside
    the cancel, so the Flink JobManager was never asked (submit.cancel) and the job ran on, unowned, after the
    driver had removed its staging. Now the cancel runs to its end (bounded by its timeout)."""
    import signal

    def cancel_interrupted(calls):
        calls.append("cancel")
        os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C
        time.sleep(0.3)
        calls.append("cancel finished")

    assert _ctrl_c_while_waiting(cancel_interrupted) == ["cancel", "cancel finished"]
