"""trainer/schedule.py: the --partition profile times the attention kernel the run resolves to."""
from __future__ import annotations

import torch

from trainer.config import model_config


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
