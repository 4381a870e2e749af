"""The shard job through Beam's portable job service with an EXTERNAL worker pool, in separate
processes (the Fn API path of Dataflow Runner v2, Flink and Spark), byte-identical to FnApiRunner.

Every run is a subprocess under a hard timeout; services are killed (whole process group) at teardown.
"""
from __future__ import annotations

import json
import os
import stat
import sys
import time

import pytest

from tests.ops_fixtures import (Service, dataset_files, free_port, portable_args, portable_services,  # noqa: F401
                                real_corpus, run_cli, shard_args, subprocess_env)

pytestmark = pytest.mark.timeout(240)


def test_portable_runner_output_is_byte_identical_to_fnapirunner(tmp_path, portable_services, record_property):
    corpus = real_corpus(tmp_path / "corpus")
    inputs = [str(corpus / "*")]
    t0 = time.monotonic()
    local = run_cli(shard_args(inputs, tmp_path / "fnapi"), timeout_s=150)  # FnApiRunner, 2 worker processes
    t_fnapi = time.monotonic() - t0
    assert local.returncode == 0, local.stderr[-3000:]
    t0 = time.monotonic()
    portable = run_cli(shard_args(inputs, tmp_path / "portable", *portable_args(portable_services)), timeout_s=150)
    t_portable = time.monotonic() - t0
    assert portable.returncode == 0, portable.stderr[-3000:] + "\n" + \
        portable_services["logs"][1].read_text()[-2000:]

    a, b = dataset_files(tmp_path / "fnapi"), dataset_files(tmp_path / "portable")
    assert a.keys() == b.keys()
    assert [k for k in a if a[k] != b[k]] == []
    manifest = json.loads(b["manifest.json"])
    assert manifest["records"]["read"] > 0 and len(manifest["shards"]) >= 2
    record_property("portable_over_fnapi_wall", round(t_portable / t_fnapi, 3))
    print(f"\nwall time: FnApiRunner {t_fnapi:.1f}s, portable+EXTERNAL pool {t_portable:.1f}s, "
          f"ratio {t_portable / t_fnapi:.2f}")


def test_unreachable_worker_pool_fails_fast_with_the_flag_named(tmp_path, portable_services):
    corpus = real_corpus(tmp_path / "corpus", names=("pile/val.jsonl.zst",))
    closed = free_port()
    args = portable_args(portable_services)
    args[-1] = f"--environment_config=localhost:{closed}"
    t0 = time.monotonic()
    res = run_cli(shard_args([str(corpus / "*")], tmp_path / "out", *args), timeout_s=60)
    assert res.returncode == 2
    assert "--environment_config" in res.stderr and "worker pool" in res.stderr
    assert time.monotonic() - t0 < 45
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_worker_that_cannot_start_fails_the_test_instead_of_hanging(tmp_path, portable_services):
    """A pool whose `python` cannot start workers makes Beam wait forever; the harness must kill and fail."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake = fake_bin / "python"
    fake.write_text("#!/bin/sh\necho 'worker cannot start' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    port = free_port()
    env = subprocess_env(PYTHONPATH=None)
    env["PATH"] = str(fake_bin) + os.pathsep + "/usr/bin:/bin"
    pool = Service([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", "--service_port", str(port)],
                   tmp_path / "pool.log", env=env, cwd=str(tmp_path))
    try:
        pool.wait_port(port)
        corpus = real_corpus(tmp_path / "corpus", names=("pile/val.jsonl.zst",))
        args = portable_args(portable_services)
        args[-1] = f"--environment_config=localhost:{port}"
        t0 = time.monotonic()
        with pytest.raises(pytest.fail.Exception, match="did not finish within"):
            run_cli(shard_args([str(corpus / "*")], tmp_path / "out", *args), timeout_s=15)
        assert time.monotonic() - t0 < 30
        assert not (tmp_path / "out" / "manifest.json").exists()
    finally:
        pool.stop()
