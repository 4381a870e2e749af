"""trainer/grad_sync.py: the mode rules, the bucket plan, and the overlapped reducer's hooks on a real (one-rank
gloo) process group: all-reduces start during the last micro-batch's backward, never during an earlier one; the
after-backward buckets reused and averaging; the global clip norm spanning pipeline stages."""
from __future__ import annotations

import os
import time
import types

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from trainer.config import ConfigError, ParallelConfig, TrainConfig, model_config, resolve_grad_reduce, resolve_layout
from trainer.model import GPTStage, build_gpt
from trainer.partition import partition_model

torch.set_num_threads(1)


@pytest.mark.parametrize("mode,pp,tp,fsdp,want", [
    ("auto", 1, 1, False, "ddp"), ("auto", 2, 1, False, "hooks"), ("auto", 1, 2, False, "hooks"),
    ("auto", 2, 2, True, "fsdp"), ("hooks", 1, 1, False, "hooks"), ("after-backward", 2, 1, False, "after-backward"),
    ("ddp", 1, 1, False, "ddp"),
])
def test_resolve_grad_reduce(mode, pp, tp, fsdp, want):
    assert resolve_grad_reduce(mode, pp=pp, tp=tp, fsdp=fsdp) == want


@pytest.mark.parametrize("changes,knob", [
    ({"pp": 2, "grad_reduce": "ddp", "microbatches": 2}, "--grad-reduce ddp"),
    ({"tp": 2, "grad_reduce": "ddp"}, "--grad-reduce ddp"),
    ({"fsdp": True, "grad_reduce": "hooks"}, "--grad-reduce hooks"),
    ({"grad_bucket_mb": 0.0}, "--grad-bucket-mb"),
])
def test_a_grad_reduce_that_cannot_run_is_refused_at_parse_time(changes, knob):
    cfg = TrainConfig(parallel=ParallelConfig(**changes))
    with pytest.raises(ConfigError, match=knob):
        resolve_layout(cfg, world=2 * cfg.parallel.pp * cfg.parallel.tp)


def test_bucket_plan_is_the_after_backward_plan():
    """Both modes pack alike (reverse order, one dtype per bucket, closed at bucket_bytes)."""
    from trainer.grad_sync import plan_buckets
    from trainer.grad_sync import GradBuckets
    shapes = [(7, 3), (5,), (4, 4), (1,), (9, 2), (3,), (8,)]
    dtypes = [torch.float32, torch.float32, torch.float32, torch.float64, torch.float64, torch.float32,
              torch.float32]
    grads = [torch.zeros(s, dtype=d) for s, d in zip(shapes, dtypes)]
    gb = GradBuckets(bucket_bytes=64)
    gb._plan(grads)
    plan = plan_buckets([(g.numel(), g.dtype) for g in grads], 64)
    assert plan == gb.layout
    assert len(plan) >= 4 and sorted(i for b in plan for i in b) == list(range(len(grads)))


@pytest.fixture(scope="module")
def group():
    """A real one-rank gloo process group (the all-reduce of one rank is the identity)."""
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield dist.group.WORLD
    dist.destroy_process_group()


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16),
                         nn.Tanh(), nn.Linear(16, 1))


def _batches(m):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(4, 6, generator=g) for _ in range(m)]


def test_hooks_start_all_reduces_inside_the_last_backward_only(group):
    from trainer.grad_sync import OverlappedBucketSync
    model, ref = _model(), _model()
    sync = OverlappedBucketSync(list(model.parameters()), group, 1, bucket_bytes=256)
    assert len(sync.layout) >= 3
    sync.begin(2)
    seen = {}
    for i, x in enumerate(_batches(2)):
        h = model[0](x)
        # runs before the first layer's gradients exist: the buckets of the later layers are already in flight
        h.register_hook(lambda g, i=i: seen.update({i: len(sync.launch_times)}))
        model[1:](h).sum().backward()
        seen[("end", i)] = len(sync.launch_times)
        ref(x).sum().backward()
    end = time.perf_counter()
    timing = sync.finish(backward_end=end)
    assert seen[0] == seen[("end", 0)] == 0  # nothing during the first micro-batch's backward
    assert 0 < seen[1] < len(sync.layout)  # some, not all, before the first layer's backward ran
    assert seen[("end", 1)] == len(sync.layout)
    assert timing.buckets == timing.in_backward == len(sync.layout) and timing.lead_s > 0
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)  # one rank: the average is the sum itself
    # the next step reuses the buffers and starts counting again
    model.zero_grad(set_to_none=True)
    sync.begin(1)
    model(_batches(1)[0]).sum().backward()
    assert sync.finish(time.perf_counter()).in_backward == len(sync.layout)


def test_a_parameter_without_gradient_is_reduced_at_finish_and_stays_none(group):
    from trainer.grad_sync import OverlappedBucketSync
    model, unused = _model(), nn.Parameter(torch.ones(3))
    sync = OverlappedBucketSync([unused] + list(model.parameters()), group, 1, bucket_bytes=256)
    sync.begin(1)
    model(_batches(1)[0]).sum().backward()
    timing = sync.finish(time.perf_counter())
    assert unused.grad is None and all(p.grad is not None for p in model.parameters())
    assert timing.in_backward == timing.buckets - 1  # the unused parameter's bucket (the last one) waited


def test_a_gradient_accumulated_after_its_bucket_started_is_refused(group):
    from trainer.grad_sync import OverlappedBucketSync
    model = _model()
    sync = OverlappedBucketSync(list(model.parameters()), group, 1, bucket_bytes=256)
    sync.begin(1)  # told one micro-batch, given two
    for x in _batches(2):
        model(x).sum().backward()
    with pytest.raises(RuntimeError, match="accumulated 2 times in a step of 1 micro-batches"):
        sync.finish(time.perf_counter())


def test_progress_line_reports_the_overlap():
    from trainer.grad_sync import GradSyncTiming
    from trainer.metrics import grad_sync_summary
    from trainer.progress import grad_sync_part
    s = grad_sync_summary([GradSyncTiming("hooks", 4, 4, 0.012, 0.001), GradSyncTiming("hooks", 4, 3, 0.010, 0.003)])
    assert s["buckets_per_step"] == 4 and s["in_backward_share"] == 7 / 8
    assert s["first_launch_lead_s"] == pytest.approx(0.011) and s["exposed_s"] == pytest.approx(0.002)
    assert grad_sync_part(s) == ("dp all-reduce (hooks): 4/4 buckets in backward, first 11.0ms before its end, "
                                 "2.0ms exposed | ")
    after = grad_sync_summary([GradSyncTiming("after-backward", 2, 0, -0.0001, 0.02)])
    assert "0/2 buckets in backward, first 0.1ms after it" in grad_sync_part(after)
    assert grad_sync_part(None) == ""


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


CFG = model_config("tiny", seq_len=32, vocab_size=64, n_layers=3, d_model=32, n_heads=2)


def _clip_worker(rank: int, init_file: str, grads: dict, max_norm: float, out: str) -> None:
    """One pipeline stage of two: its parameters get the whole model's gradients, then the trainer clips."""
    import torch.distributed as dist

    from trainer.grad_sync import clip_grad_norm
    from trainer.partition import partition_model

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    spec = partition_model(CFG, 2)[rank]
    stage = GPTStage(CFG, spec.layers, first=spec.first, last=spec.last)
    for name, p in stage.named_parameters():
        p.grad = grads["tok_emb.weight" if name == "head.weight" else name].clone()  # the synced tied grad
    env = types.SimpleNamespace(pp=2, pp_rank=rank, is_first_stage=rank == 0, is_last_stage=rank == 1,
                                pp_group=dist.group.WORLD, device=torch.device("cpu"), dp=1)
    norm = clip_grad_norm(stage, max_norm, env)
    torch.save({"norm": float(norm), "grads": {n: p.grad for n, p in stage.named_parameters()}},
               os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_global_clip_norm_spans_pipeline_stages(tmp_path):
    """Two stages clip by the norm of the whole model's gradient (tied weight counted once), exactly as the
    unpipelined model does: a stage clipping by its own norm fails this."""
    import torch.multiprocessing as mp

    whole = build_gpt(CFG)
    g = torch.Generator().manual_seed(0)
    grads = {n: torch.randn(p.shape, generator=g) for n, p in whole.named_parameters()}
    for n, p in whole.named_parameters():
        p.grad = grads[n].clone()
    max_norm = 0.5
    expected_norm = float(torch.nn.utils.clip_grad_norm_(whole.parameters(), max_norm))
    mp.spawn(_clip_worker, args=(str(tmp_path / "init"), grads, max_norm, str(tmp_path)), nprocs=2)
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for r in got:
        assert r["norm"] == pytest.approx(expected_norm, rel=1e-5)
    expected = dict(whole.named_parameters())
    for r in got:
        for name, grad in r["grads"].items():
            ref = expected["tok_emb.weight" if name == "head.weight" else name].grad
            torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-7, msg=f"clipped gradient of {name}")
