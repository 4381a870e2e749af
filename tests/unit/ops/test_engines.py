"""Spark/Flink option checks, the engines' pins and launcher jar, and the PROCESS boot's environment (no JVM)."""
from __future__ import annotations

import json
import os
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


def test_spark_runner_without_a_job_server_jar_is_refused_naming_make_spark():
    with pytest.raises(ConfigError, match=r"--spark_job_server_jar.*make spark"):
        check_engine_options({"runner": "SparkRunner", "spark_master_url": "local[4]"})


def test_missing_jar_is_refused_naming_the_make_target(tmp_path):
    with pytest.raises(ConfigError, match=r"no such file.*make flink"):
        check_engine_options({"runner": "FlinkRunner", "flink_job_server_jar": str(tmp_path / "none.jar")})


def test_missing_java_is_refused(tmp_path):
    jar = tmp_path / "j.jar"
    jar.write_bytes(b"")
    with pytest.raises(ConfigError, match=r"install OpenJDK 17.*make spark"):
        check_engine_options({"runner": "SparkRunner", "spark_job_server_jar": str(jar),
                              "job_server_java_launcher": str(tmp_path / "no-java")})


def test_a_given_job_endpoint_needs_no_jar_and_masters_are_checked(tmp_path):
    checks = check_engine_options({"runner": "SparkRunner", "job_endpoint": "localhost:8099",
                                   "spark_master_url": "spark://127.0.0.1:7077"})
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
    jar = tmp_path / "j.jar"
    jar.write_bytes(b"")
    port = free_port()
    with pytest.raises(ConfigError, match=r"--spark_master_url=spark://127.0.0.1:\d+: nothing answers"):
        runners.preflight({"runner": "SparkRunner", "spark_job_server_jar": str(jar),
                           "job_server_java_launcher": "sh", "spark_master_url": f"spark://127.0.0.1:{port}"})


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


def test_ctrl_c_during_a_job_service_run_cancels_before_beams_handler_stops_the_job_server():
    """SIGINT while waiting: the job is cancelled through the job service first (Beam's own SIGINT handler, which
    stops the job server, is held back), then the interrupt goes on as KeyboardInterrupt."""
    import signal
    import threading

    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.portability.api import beam_job_api_pb2
    from apache_beam.runners.portability import portable_runner

    from pipeline.ops.engines import submit

    calls, ended = [], threading.Event()

    class JobService:
        def Cancel(self, request, timeout=None):  # noqa: N802 - the gRPC stub's name
            calls.append("cancel")
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
        assert calls == ["cancel"]
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # Beam's handler is back
    finally:
        signal.signal(signal.SIGINT, previous)


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
