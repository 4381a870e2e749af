"""trainer/fsdp.py, checked on CPU: the FSDP2 precision policy keeps the residual stream fp32."""
from __future__ import annotations

import torch

from trainer.config import model_config


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
