"""The memory plan (trainer/plan.py) against torch's own accounting (MemTracker, CPU), its usable capacities and
FSDP2's accumulation gradients, and its verdicts for p4d layouts."""
from __future__ import annotations

import pytest
import torch

from trainer.config import model_config
from trainer.fsdp import apply_activation_checkpointing
from trainer.loss import plain_loss_sum
from trainer.model import build_gpt
from trainer.plan import GPUS, GiB, Layout, LayoutDoesNotFit, choose_micro_batch, estimate, main


ACT_HEAVY = model_config("tiny", seq_len=128, vocab_size=512, n_layers=2, d_model=128, n_heads=4, d_ff=512)
PARAM_HEAVY = model_config("tiny", seq_len=32, vocab_size=4096, n_layers=3, d_model=256, n_heads=4, d_ff=1024)


def measured_peak(cfg, batch, ac, loss) -> int:
    """Peak bytes of one steady-state training step (forward, backward, AdamW) as MemTracker sees it."""
    from torch.distributed._tools.mem_tracker import MemTracker
    torch.manual_seed(0)
    model = build_gpt(cfg)
    apply_activation_checkpointing(model, ac)
    if loss == "chunked":
        model.loss_mode, model.loss_chunk_tokens = "chunked", 256
    opt = torch.optim.AdamW(model.parameters(), foreach=True)
    t = cfg.seq_len
    ids = torch.randint(0, cfg.vocab_size, (batch, t))
    pos, seg = torch.arange(t).expand(batch, t), torch.ones(batch, t, dtype=torch.long)

    def step():
        out = model(ids, pos, seg, ids) if loss == "chunked" else plain_loss_sum(model(ids, pos, seg), ids)
        out.sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # optimizer state exists from here on: a steady-state step is measured
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        step()
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


@pytest.mark.parametrize("cfg,batch,ac,loss", [
    (ACT_HEAVY, 4, "none", "logits"), (ACT_HEAVY, 4, "selective", "chunked"), (ACT_HEAVY, 4, "full", "logits"),
    (PARAM_HEAVY, 2, "none", "chunked"),
])
def test_estimate_within_20_percent_of_memtracker(cfg, batch, ac, loss):
    torch.set_num_threads(1)
    real = measured_peak(cfg, batch, ac, loss)
    plan = estimate(cfg, Layout(micro_batch=batch, ac=ac, loss=loss, loss_chunk_tokens=256, device="cpu",
                                attention="sdpa", bf16=False))
    assert 0.8 <= plan.total / real <= 1.2, (plan.total, real, plan.parts)


def test_checkpointing_and_chunked_loss_lower_the_plan():
    base = Layout(micro_batch=8, loss="logits", ac="none")
    cfg = model_config("1.3B")
    import dataclasses
    totals = [estimate(cfg, dataclasses.replace(base, **kw), "H200").total
              for kw in ({}, {"loss": "chunked"}, {"loss": "chunked", "ac": "selective"},
                         {"loss": "chunked", "ac": "full"})]
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == 4


def test_1_3b_micro_batch_8_without_sharding_is_refused_on_a100_40gb(capsys):
    """The issue's 68 GB case: 1.3B, pp = 1, micro-batch 8, dense logits: refused with exit 2."""
    rc = main(["--model", "1.3B", "--gpu", "A100-40GB", "--dp", "8", "--micro-batch", "8", "--loss", "logits"])
    out = capsys.readouterr()
    assert rc == 2 and "DOES NOT FIT" in out.out and "does not fit on A100-40GB" in out.err
    plan = estimate(model_config("1.3B"), Layout(dp=8, micro_batch=8, loss="logits"), "A100-40GB")
    assert plan.total > 60 * GiB


def test_1_3b_fsdp_micro_batch_4_fits_one_p4d_node():
    plan = estimate(model_config("1.3B"), Layout(dp=8, fsdp=True, micro_batch=4, microbatches=16,
                                                 ac="selective"), "A100-40GB")
    assert plan.fits and plan.total < 40 * GiB


def test_6_7b_tp_pp_dp_on_four_p4d_nodes_picks_a_fitting_micro_batch():
    cfg = model_config("6.7B")
    plan = choose_micro_batch(cfg, Layout(dp=2, pp=2, tp=8, ac="selective"), 512, "A100-40GB")
    assert plan.fits and plan.layout["microbatches"] >= 4 * 2
    with pytest.raises(LayoutDoesNotFit, match="does not fit on A100-40GB"):
        choose_micro_batch(cfg, Layout(dp=32), 512, "A100-40GB")  # 6.7B replicated: 107 GB of weights + Adam


def _launcher_args(script: str, world: int) -> list:
    from tests.e2e.test_trainer_launch import LAUNCH, _dry_run, _header_example, _trainer_args
    cmd = _dry_run(LAUNCH / script, _header_example(script), NNODES=str(world // 8), SLURM_NNODES=str(world // 8),
                   SLURM_JOB_ID="1", SLURM_SUBMIT_DIR=str(LAUNCH.parents[1]))
    return _trainer_args(cmd)


@pytest.mark.parametrize("script", ["torchrun_multinode.sh", "p4d.sbatch"])
def test_launchers_header_layouts_fit_p4d(script):
    """Each launcher's resolved command passes the trainer's validation *and* the memory plan on A100-40GB
    (on the p4d node the GPU is detected; here it is named)."""
    from trainer.args import parse_args
    cfg = parse_args(_launcher_args(script, 32) + ["--gpu", "A100-40GB"], world=32)
    assert cfg.plan.fits and cfg.plan.gpu == "A100-40GB" and cfg.plan.total < 40 * GiB


def test_the_trainer_refuses_a_layout_over_the_gpu_and_takes_6_7b_as_tp_x_pp_x_dp():
    from trainer.config import ConfigError
    from trainer.args import parse_args
    common = ["--data", "/nonexistent", "--gpu", "A100-40GB", "--device", "cuda", "--global-batch", "512"]
    with pytest.raises(ConfigError, match=r"does not fit on A100-40GB even at micro-batch 1 \(\d+\.\d GiB\)"):
        parse_args(["--model", "6.7B", "--pp", "4", *common], world=16)  # pipeline alone: weights + Adam > 40 GB
    with pytest.raises(ConfigError, match=r"memory plan: \d+\.\d GiB per GPU does not fit the A100-40GB"):
        parse_args(["--model", "6.7B", "--pp", "4", "--microbatch-size", "8", *common], world=16)
    cfg = parse_args(["--model", "6.7B", "--tp", "8", "--pp", "2", "--ac", "selective", "--microbatch-size", "4",
                      *common], world=32)
    p = cfg.parallel
    assert (p.dp, p.pp, p.tp) == (2, 2, 8) and p.microbatches >= 4 * p.pp and cfg.plan.fits
    cfg = parse_args(["--model", "1.3B", "--fsdp", "--ac", "selective", "--microbatch-size", "4", *common], world=8)
    assert cfg.parallel.fsdp and cfg.plan.fits  # 1.3B as plain FSDP on one p4d node at micro-batch 4


def test_planner_uses_usable_memory_and_counts_fsdp_accumulation_grads():
    assert GPUS["A100-40GB"] < 39.5 * GiB and GPUS["H200"] <= 140 * GiB
    cfg = model_config("1.3B")
    one = estimate(cfg, Layout(dp=8, fsdp=True, micro_batch=2, microbatches=1, ac="selective", device="cuda"),
                   "H200")
    acc = estimate(cfg, Layout(dp=8, fsdp=True, micro_batch=2, microbatches=4, ac="selective", device="cuda"),
                   "H200")
    held = acc.parts["FSDP unsharded grads (accumulation)"]
    assert held == pytest.approx(4 * cfg.num_params() * 7 / 8, rel=0.02)  # ~4.9 GiB at 1.3B, less the shard
    assert acc.total - one.total >= held
    assert "FSDP unsharded grads (accumulation)" not in one.parts
