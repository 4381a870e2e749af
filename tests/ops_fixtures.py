"""Helpers for the operations tests: managed subprocesses (killed in teardown, whole process group), a real
S3-compatible server (moto's server mode) on 127.0.0.1, Beam's portable job service + an EXTERNAL worker
pool, and running the `pileprep` CLI in a subprocess under a hard timeout.

Beam's worker pool starts SDK workers with the `python` on PATH, so every subprocess gets this venv's bin
directory first on PATH (else a worker cannot start and a job waits forever).
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, shared_data

VENV_BIN = os.path.dirname(sys.executable)
TOKENIZER = ("tokenizers", "llama2-bpe-32k.model")
FAST_LOCAL = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def subprocess_env(**extra) -> dict:
    env = dict(os.environ)
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    env["PYTHONUNBUFFERED"] = "1"
    env.update({k: v for k, v in extra.items() if v is not None})
    for k in [k for k, v in extra.items() if v is None]:
        env.pop(k, None)
    return env


def kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Terminate a process we started and everything it started (its own session/process group)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(grace_s)


class Service:
    """A background process in its own session, logging to a file; `stop()` kills its whole group."""

    def __init__(self, argv, log_path: pathlib.Path, env=None, cwd=None):
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env or subprocess_env(),
                                     cwd=cwd, start_new_session=True)

    def wait_port(self, port: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"service exited with {self.proc.returncode}: {self.log_path.read_text()[-2000:]}")
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"service did not listen on {port} within {timeout_s}s: {self.log_path.read_text()[-2000:]}")

    def stop(self) -> None:
        kill_group(self.proc)
        self._log.close()


def run_cli(args, timeout_s: float, env=None, cwd=None) -> subprocess.CompletedProcess:
    """`python -m pipeline.cli ARGS` in its own process group; on timeout the group is killed and the test fails."""
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env or subprocess_env(PYTHONPATH=str(REPO)),
                            cwd=cwd or str(REPO), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, err = proc.communicate()
        pytest.fail(f"pileprep {' '.join(args[:3])} ... did not finish within {timeout_s}s (killed):\n"
                    f"{err.decode(errors='replace')[-3000:]}")
    except BaseException:  # pytest-timeout's SIGALRM failure, Ctrl-C: the run must not outlive the test
        kill_group(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(errors="replace"),
                                       err.decode(errors="replace"))


# -------------------------------------------------------------------------------------------- corpus
def real_corpus(dest: pathlib.Path, names=("pile/00.jsonl.zst", "pile/val.jsonl.zst", "pile/test.jsonl.zst",
                                           "other/enron_examples.jsonl", "other/arxiv.jsonl")) -> pathlib.Path:
    """Copy sample files (../shared/data, or their generated stand-ins: tests/fixtures/) into a scratch directory."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(shared_data(*name.split("/")), dest / name.split("/")[-1])
    return dest


def tokenizer_path() -> str:
    return str(shared_data(*TOKENIZER))


def shard_args(inputs, output, *extra) -> list:
    return ["shard", "--input", *inputs, "--output", str(output), "--tokenizer", tokenizer_path(),
            "--seq-len", "256", "--num-shards", "2", "--val-fraction", "0.2", "--test-fraction", "0.1",
            "--progress-every", "0", *extra]


def dataset_files(root: pathlib.Path) -> dict:
    """Relative path -> bytes of every file of a dataset (staging excluded, it is deleted at commit)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "_staging" not in p.parts}


# ------------------------------------------------------------------------------------------------ S3
class S3Server:
    def __init__(self, service: Service, endpoint: str):
        self.service = service
        self.endpoint = endpoint

    def client(self, key_id="testing", secret="testing"):
        import boto3  # noqa: PLC0415

        return boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id=key_id,
                            aws_secret_access_key=secret)

    def beam_args(self) -> list:
        return [f"--s3_endpoint_url={self.endpoint}", "--s3_region_name=us-east-1"]


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """moto's S3 server on 127.0.0.1 (any credentials accepted); killed at module teardown."""
    moto = os.path.join(VENV_BIN, "moto_server")
    if not os.path.exists(moto):
        pytest.skip("moto[server] is not installed (pip install 'moto[server]')")
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    service = Service([moto, "-H", "127.0.0.1", "-p", str(port)], log)
    try:
        service.wait_port(port)
        yield S3Server(service, f"http://127.0.0.1:{port}")
    finally:
        service.stop()


@pytest.fixture(scope="module")
def s3_env():
    """Credentials through the usual source (environment variables), for the CLI subprocess and boto3 here."""
    return subprocess_env(PYTHONPATH=str(REPO), AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                          AWS_DEFAULT_REGION="us-east-1", AWS_PROFILE=None, AWS_ENDPOINT_URL=None,
                          AWS_ENDPOINT_URL_S3=None)


# ------------------------------------------------------------------------------------------- portable
@pytest.fixture(scope="module")
def portable_services(tmp_path_factory):
    """Beam's portable job service and an EXTERNAL worker pool, separate processes, killed at teardown.

    The worker pool runs from an empty directory without PYTHONPATH: workers import pileprep the way remote
    workers do, as an installed package (`pip install .` / `-e .`), not from the test's working tree.
    """
    with start_portable_services(tmp_path_factory.mktemp("portable"), subprocess_env(PYTHONPATH=None)) as services:
        yield services


@contextlib.contextmanager
def start_portable_services(tmp: pathlib.Path, env: dict):
    """The job service and worker pool of `portable_services`, with the workers' environment `env`."""
    job_port, pool_port = free_port(), free_port()
    job = Service([sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main",
                   "--port", str(job_port)], tmp / "job_service.log", env=env, cwd=str(tmp))
    pool = Service([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                    "--service_port", str(pool_port)], tmp / "worker_pool.log", env=env, cwd=str(tmp))
    try:
        job.wait_port(job_port)
        pool.wait_port(pool_port)
        yield {"job_endpoint": f"localhost:{job_port}", "worker_pool": f"localhost:{pool_port}",
               "logs": (job.log_path, pool.log_path)}
    finally:
        pool.stop()
        job.stop()


def portable_args(services) -> list:
    return ["--runner=PortableRunner", f"--job_endpoint={services['job_endpoint']}", "--environment_type=EXTERNAL",
            f"--environment_config={services['worker_pool']}"]
