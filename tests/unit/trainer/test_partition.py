"""trainer/partition.py: no layer dropped, the balanced split optimal, measured times used."""
from __future__ import annotations

import pytest
import torch

from trainer.config import model_config
from trainer.partition import balanced_splits, even_splits, model_units, partition_model, stage_loads, unit_costs

torch.set_num_threads(1)


CFG = model_config("tiny", seq_len=32, vocab_size=64, n_layers=3, d_model=32, n_heads=2)


@pytest.mark.parametrize("layers,stages", [(1, 2), (3, 2), (5, 3), (7, 4), (12, 5), (24, 8)])
def test_partition_never_drops_a_layer(layers, stages):
    cfg = CFG.replace(n_layers=layers)
    for method in ("flops", "even"):
        specs = partition_model(cfg, stages, method)
        assert [l for s in specs for l in s.layers] == list(range(layers))
        assert specs[0].first and specs[-1].last and all(s.units for s in specs)


def test_auto_partition_balances_an_uneven_model():
    """5 blocks + a vocabulary head as big as 4 blocks on 2 stages: layer-count splitting overloads the last
    stage; the balanced split moves blocks to stage 0 and is optimal (checked by brute force)."""
    cfg = CFG.replace(n_layers=5, vocab_size=4096, d_model=64, n_heads=4)
    units = model_units(cfg)
    costs = unit_costs(units)
    auto = partition_model(cfg, 2, "flops")
    even = partition_model(cfg, 2, "even")
    auto_max, even_max = max(stage_loads(units, auto, costs)), max(stage_loads(units, even, costs))
    assert auto_max < even_max
    brute = min(max(sum(costs[:k]), sum(costs[k:])) for k in range(1, len(costs)))
    assert auto_max == pytest.approx(brute)


def test_partition_uses_measured_times():
    times = [0.1] + [1.0, 1.0, 5.0] + [0.1]  # block 2 measured 5x slower (e.g. a slow device)
    specs = partition_model(CFG, 2, "profile", times=times, time_weight=1.0)
    assert specs[1].layers == (2,)
    assert even_splits(5, 2) == [(0, 3), (3, 5)]
    assert balanced_splits([1, 1, 1, 1], 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ValueError, match="cannot fill"):
        balanced_splits([1, 1], 3)
