"""trainer/config.py: the parameter count and FLOPs per token the named sizes promise."""
from __future__ import annotations

import pytest
import torch

from trainer.config import model_config
from trainer.model import build_gpt

torch.set_num_threads(1)


CFG = model_config("tiny", seq_len=32, vocab_size=64, n_layers=3, d_model=32, n_heads=2)


def test_param_count_and_flops_from_config():
    assert sum(p.numel() for p in build_gpt(CFG).parameters()) == CFG.num_params()
    untied = CFG.replace(tie_embeddings=False)
    assert sum(p.numel() for p in build_gpt(untied).parameters()) == untied.num_params()
    sizes = {n: model_config(n).num_params() / 1e9 for n in ("125M", "1.3B", "6.7B")}
    assert sizes["125M"] == pytest.approx(0.125, rel=0.05)
    assert sizes["1.3B"] == pytest.approx(1.3, rel=0.05)
    assert sizes["6.7B"] == pytest.approx(6.7, rel=0.05)
    c = model_config("1.3B")  # ~6N + 12 L d T
    n = c.n_layers * 12 * c.d_model ** 2 + c.vocab_size * c.d_model
    assert c.flops_per_token() == pytest.approx(6 * n + 12 * c.n_layers * c.d_model * c.seq_len, rel=0.01)
