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


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    from tests.trainer_fixtures import write_dataset
    return write_dataset(str(tmp_path_factory.mktemp("p2-data")), seq_len=32, vocab=64, n_docs=400)


@pytest.mark.timeout(400)
def test_cli_fsdp_x_tp_trains_checkpoints_and_resumes_like_one_process(dataset, tmp_path):
    """`trainer.train --dp 2 --tp 2 --fsdp --ac selective` (4 processes): stopped at step 2, resumed from its
    checkpoint (DTensor parameters and optimizer state through DCP), every step's loss equals one process's."""
    from tests.trainer_launch import TINY, losses, run_trainer
    common = ["--data", dataset, *TINY, "--steps", "3", "--log-every", "1"]
    run_trainer(1, common + ["--metrics-file", str(tmp_path / "one.jsonl")])
    par = common + ["--dp", "2", "--tp", "2", "--fsdp", "--ac", "selective", "--microbatches", "2",
                    "--checkpoint-dir", str(tmp_path / "ck"), "--metrics-file", str(tmp_path / "par.jsonl")]
    run_trainer(4, par + ["--stop-at-step", "2"], timeout=200)
    proc = run_trainer(4, par, timeout=200)
    assert "resumed from" in proc.stdout and "at step 2" in proc.stdout
    one, got = losses(tmp_path / "one.jsonl"), losses(tmp_path / "par.jsonl")
    assert sorted(got) == [1, 2, 3]
    for step in one:
        assert got[step] == pytest.approx(one[step], rel=1e-5), step
