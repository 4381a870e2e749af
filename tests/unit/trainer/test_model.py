"""trainer/model.py: attention stays inside a document, and stages compose to the whole model."""
from __future__ import annotations

import torch

from trainer.attention import dense_mask
from trainer.config import model_config
from trainer.model import GPTStage, build_gpt

torch.set_num_threads(1)


CFG = model_config("tiny", seq_len=32, vocab_size=64, n_layers=3, d_model=32, n_heads=2)


def test_attention_never_crosses_documents():
    model = build_gpt(CFG).eval()
    ids = torch.randint(2, 64, (1, 32))
    seg = torch.tensor([[1] * 10 + [2] * 14 + [3] * 5 + [0] * 3])
    pos = torch.cat([torch.arange(10), torch.arange(14), torch.arange(5), torch.zeros(3, dtype=torch.long)])[None]
    out = model(ids, pos, seg)
    ids2 = ids.clone()
    ids2[0, :10] = torch.randint(2, 64, (10,))  # change document 1 only
    out2 = model(ids2, pos, seg)
    torch.testing.assert_close(out[0, 10:], out2[0, 10:])  # documents 2, 3 and padding unaffected
    assert not torch.allclose(out[0, :10], out2[0, :10])
    m = dense_mask(seg)[0, 0]
    assert m[12, 11] and not m[12, 9] and not m[11, 12]


def test_stages_compose_to_the_whole_model():
    full = build_gpt(CFG)
    s0 = GPTStage(CFG, [0, 1], first=True, last=False)
    s1 = GPTStage(CFG, [2], first=False, last=True)
    ids = torch.randint(0, 64, (2, 32))
    pos = torch.arange(32).expand(2, 32)
    seg = torch.ones(2, 32, dtype=torch.long)
    torch.testing.assert_close(s1(*s0(ids, pos, seg)), full(ids, pos, seg))
    torch.testing.assert_close(s1.head.weight, full.tok_emb.weight)  # tied copy starts equal
