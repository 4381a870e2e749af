"""CUDA-facing decisions checked on CPU: reused gradient buckets, the FSDP2 precision policy and an fp32
residual stream, the planner's usable capacities and FSDP2's accumulation gradients, the process-group timeout
and profiling with the run's attention kernel."""
from __future__ import annotations

import types

import pytest
import torch

from trainer.config import model_config
from trainer.plan import GPUS, GiB, Layout, estimate


def test_grad_buckets_reuse_their_buffers_and_average(monkeypatch):
    import torch.distributed as dist
    from trainer.grad_sync import GradBuckets

    class Done:
        def wait(self):
            pass

    calls = []
    monkeypatch.setattr(dist, "all_reduce", lambda buf, group=None, async_op=False: calls.append(buf) or Done())
    b = GradBuckets(bucket_bytes=64)  # 16 fp32 values per bucket: several buckets
    grads = [torch.full((10,), 4.0), torch.full((3, 4), 8.0), torch.full((20,), 2.0)]
    b.reduce(grads, None, 2)
    ptrs = [buf.data_ptr() for buf in b.buffers]
    assert len(b.buffers) >= 2 and [g.unique().item() for g in grads] == [2.0, 4.0, 1.0]  # divided by world
    grads = [torch.full((10,), 4.0), torch.full((3, 4), 8.0), torch.full((20,), 2.0)]  # a new step's grads
    b.reduce(grads, None, 2)
    assert [buf.data_ptr() for buf in b.buffers] == ptrs  # the same buffers: no allocation per step
    assert len(calls) == 2 * len(ptrs)
    assert [g.unique().item() for g in grads] == [2.0, 4.0, 1.0]


def test_fsdp2_policy_keeps_the_residual_stream_fp32():
    from trainer.fsdp import mixed_precision
    mp = mixed_precision(torch.device("cuda"), True)  # a policy object: no GPU needed to build it
    assert mp.param_dtype == torch.bfloat16 and mp.reduce_dtype == torch.float32
    assert mp.cast_forward_inputs is False
    from trainer.model import GPTStage
    cfg = model_config("tiny", seq_len=16, vocab_size=64, n_layers=1, d_model=32, n_heads=2)
    stage = GPTStage(cfg, [], first=True, last=False)
    stage.to(torch.bfloat16)  # the embedding weights FSDP2 all-gathers under that policy
    ids = torch.randint(0, 64, (2, 16))
    x, _ = stage(ids, torch.arange(16).expand(2, 16), torch.ones(2, 16, dtype=torch.long))
    assert x.dtype == torch.float32  # the blocks receive an fp32 residual stream (CUDA autocast keeps it)


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


def test_process_group_gets_an_explicit_timeout(monkeypatch):
    import torch.distributed as dist
    from trainer import mesh
    seen = {}

    class Stop(Exception):
        pass

    def fake_init(**kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", fake_init)
    # a world of one, set through monkeypatch so that nothing leaks into later tests' environment
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(Stop):
        mesh.init_distributed(types.SimpleNamespace(dp=1, pp=1, tp=1, timeout_minutes=45.0), "cpu")
    assert seen["timeout"].total_seconds() == 45 * 60


def test_partition_profile_runs_the_resolved_attention_kernel(monkeypatch):
    from trainer import attention, schedule
    impls = []
    real = attention.build_mask
    monkeypatch.setattr(attention, "build_mask", lambda seg, impl: impls.append(impl) or real(seg, impl))
    cfg = model_config("tiny", seq_len=16, vocab_size=64, n_layers=2, d_model=32, n_heads=2)
    # (flex has no CPU backward: on CPU the run resolves to sdpa, and so must the profile)
    times = schedule.profile_unit_times(cfg, 2, torch.device("cpu"), repeats=1, attention="auto")
    assert len(times) == cfg.n_layers + 2 and all(t > 0 for t in times)
    assert impls and set(impls) == {"sdpa"}
