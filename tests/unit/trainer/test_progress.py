"""The trainer's figures that cannot flatter (trainer/metrics.py, trainer/progress.py): interval timing from the
wall clock, the MFU line's convention, the executed-attention estimate, the --max-seconds check cadence, the
ETA and the last line's resume command."""
from __future__ import annotations

import shlex
import time

import pytest
import torch

from trainer.config import model_config
from trainer.metrics import (MetricsLogger, attended_keys_per_token, eta_seconds, hardware_flops_per_token,
                             interval_rates)
from trainer.progress import final_line, format_progress, resume_argv, resume_command


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_rates_are_tokens_over_the_interval_wall_not_summed_step_times():
    """A CUDA step returns once its kernels are queued: host step times (0.001 s here) must not make the
    figures; the interval's wall (0.5 s per step) does."""
    clock = FakeClock()
    m = MetricsLogger(1e6, 2, torch.device("cpu"), is_writer=False, clock=clock, total_steps=10)
    for _ in range(4):
        clock.t += 0.5
        m.record_step(loss=1.0, step_seconds=0.001, read=0.0, decode=0.0, h2d=0.0, tokens=1000)
    rec = m.flush(4, 1e-3, 0.5)
    assert rec["tokens_per_s"] == pytest.approx(4000 / 2.0)
    assert rec["step_seconds"] == pytest.approx(0.5)
    assert rec["tflops_per_device"] == pytest.approx(2000 * 1e6 / 2 / 1e12)
    assert rec["eta_s"] == pytest.approx(6 * 0.5)
    # a checkpoint save inside the next interval is not training time
    clock.t += 3.0
    m.exclude(2.0)
    m.record_step(loss=1.0, read=0.0, decode=0.0, tokens=1000)
    rec = m.flush(5, 1e-3, 0.5)
    assert rec["interval_seconds"] == pytest.approx(1.0) and rec["tokens_per_s"] == pytest.approx(1000)


def test_printed_tokens_per_second_match_an_outer_wall_clock_within_2_percent():
    m = MetricsLogger(1e6, 1, torch.device("cpu"), is_writer=False)
    t0 = time.perf_counter()
    x = torch.randn(128, 128)
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(20):
            x = torch.tanh(x @ x)
        time.sleep(0.02)  # work the host does not see as "step time" (a queued device, a collective)
        m.record_step(loss=0.0, step_seconds=time.perf_counter() - t - 0.02, read=0.0, decode=0.0, tokens=4096)
    rec = m.flush(5, 1e-3, 0.0)
    outer = time.perf_counter() - t0
    assert rec["tokens_per_s"] * outer / (5 * 4096) == pytest.approx(1.0, rel=0.02)


def test_mfu_line_states_its_convention_and_the_executed_work_estimate():
    cfg = model_config("1.3B")
    m = MetricsLogger(cfg.flops_per_token(), 1, torch.device("cpu"), is_writer=False, model_cfg=cfg,
                      total_steps=100, clock=FakeClock())
    m._peak = 989.0  # as on an H200
    seg = torch.ones(2, cfg.seq_len, dtype=torch.long)
    seg[:, cfg.seq_len // 2:] = 2  # two documents per row: half the causal attention of one
    m.clock.t += 1.0
    m.record_step(loss=2.0, read=0.0, decode=0.0, tokens=16 * 2048, segment_ids=seg)
    rec = m.flush(1, 3e-4, 1.25)
    line = format_progress(rec)
    assert "6N+12LdT" in line and "989 TFLOP/s" in line and "HFU est" in line
    for part in ("step      1/100", "loss 2.0000", "lr 3.00e-04", "grad norm 1.250", "tok/s", "elapsed", "ETA"):
        assert part in line, part
    assert rec["hfu"] < rec["mfu"]  # document masking: less attention executed than the convention counts


def test_attended_keys_and_hardware_flops():
    seg = torch.tensor([[1, 1, 1, 1, 2, 2, 0, 0]])  # documents of 4, 2 and 2 (padding) tokens
    assert attended_keys_per_token(seg) == pytest.approx((10 + 3 + 3) / 8)
    cfg = model_config("125M")
    full_t = cfg.seq_len  # the convention's full T x T attention is the executed work of T keys per token
    assert hardware_flops_per_token(cfg, full_t) == pytest.approx(cfg.flops_per_token())
    # full activation checkpointing runs every block's forward (a third of its training FLOPs) once more
    extra = hardware_flops_per_token(cfg, full_t, ac="full") - hardware_flops_per_token(cfg, full_t, "none")
    assert extra == pytest.approx(cfg.n_layers * cfg.block_flops_per_token() / 3)


def test_interval_rates_without_a_peak_report_no_mfu():
    r = interval_rates(1000, 2, 0.5, 1e6, 1, None)
    assert r["tokens_per_s"] == 2000 and r["step_seconds"] == 0.25 and r["mfu"] is None
    assert "MFU n/a" in format_progress({**r, "step": 1, "loss": 1.0, "lr": 1e-3, "grad_norm": 1.0,
                                        "peak_memory_bytes": 0, "data_wait_share": 0.0,
                                        "data_wait": {"read": 0, "decode": 0, "h2d": 0}})


def test_max_seconds_agrees_on_the_clock_only_every_n_steps():
    from trainer.train import StopClock
    calls = []
    clock = FakeClock()

    def agree(value):
        calls.append(value)
        return value

    stop = StopClock(10.0, every=5, agree=agree, clock=clock)
    stopped_at = None
    for step in range(1, 31):
        clock.t += 1.0
        if stop.should_stop(step):
            stopped_at = step
            break
    assert stopped_at == 15 and len(calls) == 3  # steps 5, 10, 15: not one collective per step
    assert StopClock(0.0, 1, agree=agree).should_stop(1) is False and len(calls) == 3


def test_eta():
    assert eta_seconds(10, 40, 10, 20.0) == pytest.approx(60.0)
    assert eta_seconds(40, 40, 10, 20.0) == 0 and eta_seconds(1, 0, 1, 1.0) is None


def test_resume_command_repeats_the_run_without_its_stop_and_fresh_flags():
    argv = ["--data", "out/sample", "--no-resume", "--stop-at-step", "20", "--steps", "40", "--stop-at-step=3",
            "--checkpoint-dir", "out/train/ckpt"]
    assert resume_argv(argv) == ["--data", "out/sample", "--steps", "40", "--checkpoint-dir", "out/train/ckpt"]
    env = {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}
    cmd = resume_command(argv, "trainer.train", env, cwd="/work/my dir")
    assert cmd.startswith("cd '/work/my dir' && ")
    assert shlex.split(cmd.split("&& ", 1)[1]) == ["torchrun", "--standalone", "--nproc-per-node", "4", "-m",
                                                   "trainer.train", *resume_argv(argv)]
    multi = resume_command(argv, "trainer.train", {**env, "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}, cwd="/w")
    assert "--nnodes 2 --nproc-per-node 8" in multi
    line = final_line(20, 40, "out/train/ckpt/step_00000020", cmd)
    assert line.startswith("stopped at step 20/40; checkpoint out/train/ckpt/step_00000020; resume with: cd ")
    assert "no checkpoint" in final_line(40, 40, None, cmd)
