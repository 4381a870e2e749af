"""trainer/grad_sync.py: the mode rules, the bucket plan, and the overlapped reducer's hooks on a real (one-rank
gloo) process group: all-reduces start during the last micro-batch's backward, never during an earlier one."""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from trainer.config import ConfigError, ParallelConfig, TrainConfig, resolve_grad_reduce, resolve_layout


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
