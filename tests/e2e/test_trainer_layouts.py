"""Every layout the trainer accepts against the unparallelised model, through optimizer steps.

One real `torchrun` with 4 gloo processes on CPU runs every layout in turn (tests/parallel_worker.py) through
the trainer's own build and `train_step` (DDP, ZeRO-1, FSDP2, tensor parallel, pipeline schedules, RETRO, the
AdamW grouping, fused and foreach AdamW); each rank compares every step's loss and gradient norm, the first
step's full gradient of every parameter it holds, and every parameter after the last optimizer step with one
process running plain AdamW on the same global batches.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess

import pytest

from tests.trainer_launch import REPO, TORCHRUN, _port, env

# key=value,... for tests/parallel_worker.py (defaults dp=pp=tp=1, no fsdp/zero/retro, ac none, m=1, foreach)
LAYOUTS = {
    "dp4 (DDP)": "dp=4,m=2",
    "dp4 (DDP) fused": "dp=4,adamw=fused",
    "pp4 gpipe": "pp=4,m=4,schedule=gpipe",
    "dp2 x pp2 fused": "dp=2,pp=2,m=2,adamw=fused",
    "zero dp4": "dp=4,zero=1",
    "zero dp2 x pp2 fused": "dp=2,pp=2,m=2,zero=1,adamw=fused",
    "fsdp2": "dp=4,fsdp=1,ac=selective,m=2",
    "fsdp2 x pp2 fused": "dp=2,pp=2,fsdp=1,m=2,adamw=fused",
    "tp2 x dp2": "dp=2,tp=2,m=2",
    "tp2 x dp2 fused": "dp=2,tp=2,m=2,adamw=fused",
    "tp2 x pp2": "pp=2,tp=2,ac=full,m=2",
    "tp2 x pp2 fused": "pp=2,tp=2,m=2,adamw=fused",
    "fsdp2 x tp2": "dp=2,tp=2,fsdp=1,ac=selective,m=2",
    "fsdp2 x tp2 fused": "dp=2,tp=2,fsdp=1,adamw=fused",
    "interleaved 1f1b (dp2 x pp2 x v2)": "dp=2,pp=2,v=2,m=2",
    "interleaved 1f1b fused": "dp=2,pp=2,v=2,m=2,adamw=fused",
    "retro x pp2": "dp=2,pp=2,m=2,retro=1",
    "retro x pp2 fused": "dp=2,pp=2,m=2,retro=1,adamw=fused",
}


def _tag(spec: str) -> str:
    from tests.parallel_worker import parse, tag
    return tag(parse(spec))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("parallel2")
    cmd = TORCHRUN + ["--nnodes", "1", "--nproc-per-node", "4", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                      f"127.0.0.1:{_port()}", "--max-restarts", "0", str(REPO / "tests" / "parallel_worker.py"),
                      "--out", str(out), "--layouts", *LAYOUTS.values()]
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=330)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return [json.loads(line) for r in range(4) for line in open(out / f"rank{r}.jsonl")]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_steps_like_one_process(results, name):
    rows = [r for r in results if r["layout"] == _tag(LAYOUTS[name])]
    assert len(rows) == 4
    held = set()
    for r in rows:
        assert "error" not in r, r.get("error")
        assert r["fused"] == ("adamw=fused" in LAYOUTS[name]), r
        for got, want in zip(r["losses"], r["ref_losses"]):
            assert got == pytest.approx(want, rel=1e-5), r
        for got, want in zip(r["norms"], r["ref_norms"]):
            assert got == pytest.approx(want, rel=1e-5), r
        assert len(r["losses"]) == 2
        assert r["max_rel_grad_error"] < 1e-4, r
        worst = max(r["param_excess"], key=r["param_excess"].get)
        assert r["param_excess"][worst] <= r["atol"], f"{worst} after 2 AdamW steps: {r['param_excess'][worst]}"
        held |= set(r["params"])
    # every block's parameters are held by some rank: no layer dropped by the partition
    assert {n.split(".")[1] for n in held if n.startswith("blocks.")} == {"0", "1", "2"}
    if "retro=1" in LAYOUTS[name]:
        assert {n.split(".")[1] for n in held if n.startswith("retro.")} == {"0", "2"}


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
    first = run_trainer(4, par + ["--stop-at-step", "2"], timeout=200)
    # each progress line: step/total, loss, lr, grad norm, tokens/s, MFU, elapsed, ETA
    progress = [line for line in first.stdout.splitlines() if line.startswith("step ")]
    assert progress and all(re.search(r"^step +\d+/3 \| loss [\d.]+ \| lr [\d.e+-]+ \| grad norm [\d.]+ \| "
                                      r"[\d,]+ tok/s \|.*MFU .*\| elapsed [\d.hms]+ \| ETA [\d.hms]+$", line)
                            for line in progress), progress
    # the last line names the checkpoint and the exact command that resumes: run that command
    last = first.stdout.strip().splitlines()[-1]
    m = re.match(r"stopped at step 2/3; checkpoint (\S+); resume with: cd (\S+) && (.*)$", last)
    assert m and m.group(1) == str(tmp_path / "ck" / "step_00000002"), last
    cmd = shlex.split(m.group(3))
    assert cmd[:4] == ["torchrun", "--standalone", "--nproc-per-node", "4"] and "--stop-at-step" not in cmd
    proc = subprocess.run(TORCHRUN + cmd[1:], cwd=m.group(2), env=env(), capture_output=True, text=True,
                          timeout=200)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "resumed from" in proc.stdout and "at step 2" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("finished 3/3 steps; checkpoint ")
    one, got = losses(tmp_path / "one.jsonl"), losses(tmp_path / "par.jsonl")
    assert sorted(got) == [1, 2, 3]
    for step in one:
        assert got[step] == pytest.approx(one[step], rel=1e-5), step
