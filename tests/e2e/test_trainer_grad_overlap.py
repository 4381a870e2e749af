"""The overlapped gradient all-reduce (trainer/grad_sync.py) under real torchrun, 2 gloo processes on CPU.

The same dp 2 x 2 micro-batch run with each reduction mode: per-bucket hooks that start during the last
micro-batch's backward (with and without full activation checkpointing), DDP, and the non-overlapped bucketed
all-reduce after the backward. Losses and every parameter after the optimizer steps agree between the modes and
with one process; the hooks' timestamps show every bucket's all-reduce launched before the backward returned,
and the CLI's progress line and metrics record report it.
"""
from __future__ import annotations

import re
import subprocess

import pytest

from tests.parallel_worker import ATOL, RTOL
from tests.trainer_launch import REPO, TINY, TORCHRUN, _port, env, read_metrics, run_trainer

MODES = ["hooks", "after-backward", "ddp", "hooks:full"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    import torch
    out = tmp_path_factory.mktemp("grad-overlap")
    cmd = TORCHRUN + ["--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                      f"127.0.0.1:{_port()}", "--max-restarts", "0", str(REPO / "tests" / "grad_overlap_worker.py"),
                      "--out", str(out), "--modes", *MODES]
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return {(m, r): torch.load(out / f"{m.replace(':', '_')}.rank{r}.pt", weights_only=False)
            for m in MODES for r in range(2)}


def _close(got, want, rtol, atol=1e-7):
    return all(bool(((g - w).abs() <= rtol * w.abs() + atol).all()) for g, w in zip(got, want))


@pytest.mark.timeout(200)
def test_overlapped_all_reduce_steps_like_the_reduction_after_backward(runs):
    for rank in range(2):
        base = runs[("after-backward", rank)]
        assert base["reducer"] == "AfterBackwardSync"
        for mode in MODES:
            r = runs[(mode, rank)]
            assert r["losses"] == pytest.approx(base["losses"], rel=1e-6), mode
            assert r["norms"] == pytest.approx(base["norms"], rel=1e-6), mode
            names = sorted(base["params"])
            assert sorted(r["params"]) == names
            assert _close([r["params"][n] for n in names], [base["params"][n] for n in names], 1e-6), mode
            # and with one process (tests/parallel_worker.py's reference and tolerance: plain AdamW, same batches)
            assert r["losses"] == pytest.approx(r["ref"]["losses"], rel=1e-5), mode
            assert _close([r["params"][n] for n in names], [r["ref"]["params"][n] for n in names], RTOL, ATOL), mode
    # both ranks hold the same parameters (the average reached everyone)
    for mode in MODES:
        a, b = runs[(mode, 0)]["params"], runs[(mode, 1)]["params"]
        assert all(bool((a[n] == b[n]).all()) for n in a), mode


@pytest.mark.timeout(200)
def test_hooks_launch_every_bucket_before_the_backward_ends(runs):
    for rank in range(2):
        for mode in ("hooks", "hooks:full"):
            r = runs[(mode, rank)]
            assert r["reducer"] == "OverlappedBucketSync"
            for t in r["timings"]:
                assert t.mode == "hooks" and t.buckets >= 4, t
                assert t.in_backward == t.buckets, t  # none left for after the backward
                assert t.lead_s > 0, t  # first launch < backward end
        for t in runs[("after-backward", rank)]["timings"]:
            assert t.in_backward == 0 and t.lead_s <= 0 and t.exposed_s > 0, t
        for t in runs[("ddp", rank)]["timings"]:
            assert t.buckets >= 1 and t.in_backward == t.buckets and t.lead_s > 0, t


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from tests.trainer_fixtures import write_dataset
    return write_dataset(str(tmp_path_factory.mktemp("overlap-data")), seq_len=32, vocab=64, n_docs=200)


@pytest.mark.timeout(200)
def test_cli_reports_the_overlap_in_its_step_timing(dataset, tmp_path):
    metrics = tmp_path / "m.jsonl"
    proc = run_trainer(2, ["--data", dataset, *TINY, "--steps", "2", "--log-every", "1", "--microbatches", "2",
                           "--grad-reduce", "hooks", "--grad-bucket-mb", "0.02", "--metrics-file", str(metrics)])
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) == 2
    for line in lines:
        m = re.search(r"\| dp all-reduce \(hooks\): (\d+)/(\d+) buckets in backward, first ([\d.]+)ms before its "
                      r"end, [\d.]+ms exposed \| elapsed", line)
        assert m and m.group(1) == m.group(2) and int(m.group(2)) >= 4 and float(m.group(3)) > 0, line
    for rec in read_metrics(metrics):
        g = rec["grad_sync"]
        assert g["mode"] == "hooks" and g["in_backward_share"] == 1.0 and g["first_launch_lead_s"] > 0, g
