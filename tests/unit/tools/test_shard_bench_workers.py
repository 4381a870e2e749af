"""bench/shard_bench.py's worker count (the denominator of its per-core ratios) is the job's: --direct_num_workers
when given, else pileprep's default runner's, one worker per core (pipeline/beam_glue.py default_beam_args).

Found by the s37 review: the bench imported `DEFAULT_BEAM_ARGS` from pipeline/shard/shard_pipeline.py, which never
existed; a bare `except` hid the ImportError, so every run without --beam-args divided by 2 workers.
"""
from __future__ import annotations

import importlib.util
import os

from tests.conftest import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("shard_bench", REPO / "bench" / "shard_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_default_is_one_worker_per_core_and_a_given_count_wins(monkeypatch):
    bench = _bench()
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(16)))
    assert bench.default_workers([]) == 16
    assert bench.default_workers(["--direct_num_workers=3"]) == 3
    assert bench.default_workers(["--direct_num_workers", "5"]) == 5
