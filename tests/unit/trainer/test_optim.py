"""trainer/optim.py on its own: AdamW groups (no decay on vectors), the fused/foreach choice and the learning-rate
schedule (the optimizer in a real run: tests/unit/trainer/test_gpu_check.py, tests/e2e)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from trainer.config import OptimConfig, TrainConfig
from trainer.optim import adamw_impl, lr_at, param_groups


def test_matrices_decay_and_vectors_do_not_in_first_appearance_order():
    module = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2, bias=False))
    groups = param_groups(module, 0.1)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    decay, plain = (g["params"] for g in groups)
    assert [p.shape for p in decay] == [(4, 3), (2, 4)]
    assert [p.shape for p in plain] == [(4,), (4,), (4,)]  # the bias, the norm's weight and bias


def test_auto_picks_fused_on_cuda_only_and_an_unknown_choice_is_refused():
    assert adamw_impl("auto", torch.device("cuda")) == "fused"
    assert adamw_impl("auto", torch.device("cpu")) == "foreach"
    assert adamw_impl("fused", torch.device("cpu")) == "fused"
    with pytest.raises(ValueError, match="unknown --adamw 'fast'"):
        adamw_impl("fast", torch.device("cpu"))


def test_lr_warms_up_linearly_then_decays_by_cosine_to_a_tenth():
    cfg = TrainConfig(optim=OptimConfig(lr=1.0, warmup_steps=4), steps=14)
    assert [lr_at(s, cfg) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(4, cfg) == pytest.approx(1.0)
    assert lr_at(9, cfg) == pytest.approx(0.55)  # half way: the cosine's middle
    assert lr_at(14, cfg) == pytest.approx(0.1) == lr_at(100, cfg)  # never below a tenth
