"""FSDP2, tensor parallelism and the interleaved pipeline schedule against the unparallelised model.

One real `torchrun` with 4 gloo processes on CPU runs every layout in turn (tests/parallel_worker.py) through
the trainer's own modules; each rank compares its loss, the global gradient norm and the full gradient of every
parameter it holds with the single-process reference on the same global batch.
"""
from __future__ import annotations

import json
import subprocess

import pytest

from tests.trainer_launch import REPO, TORCHRUN, _port, env

# dp, pp, tp, fsdp, activation checkpointing, micro-batches[, virtual stages]
LAYOUTS = {
    "fsdp2": "4,1,1,1,selective,2",
    "fsdp2 x pp": "2,2,1,1,none,2",
    "tp2 x pp2": "1,2,2,0,full,2",
    "fsdp2 x tp2": "2,1,2,1,selective,2",
    "interleaved 1f1b (dp2 x pp2 x v2)": "2,2,1,0,none,2,2",
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("parallel2")
    cmd = TORCHRUN + ["--nnodes", "1", "--nproc-per-node", "4", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                      f"127.0.0.1:{_port()}", "--max-restarts", "0", str(REPO / "tests" / "parallel_worker.py"),
                      "--out", str(out), "--layouts", *LAYOUTS.values()]
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-6000:]
    rows = [json.loads(line) for r in range(4) for line in open(out / f"rank{r}.jsonl")]
    return rows


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_unparallelised_model(results, name):
    dp, pp, tp, fsdp, ac, m, *v = LAYOUTS[name].split(",")
    tag = f"dp{dp}-pp{pp}-tp{tp}-v{v[0] if v else 1}-{'fsdp' if fsdp == '1' else 'nofsdp'}-{ac}"
    rows = [r for r in results if r["layout"] == tag]
    assert len(rows) == 4
    held = set()
    for r in rows:
        assert r["loss"] == pytest.approx(r["ref_loss"], rel=1e-5), r
        assert r["norm"] == pytest.approx(r["ref_norm"], rel=1e-5), r
        assert r["max_rel_grad_error"] < 1e-4, r
        held |= set(r["params"])
    # every block's parameters are held by some rank: no layer dropped by the partition
    assert {n.split(".")[1] for n in held if n.startswith("blocks.")} == {"0", "1", "2"}
