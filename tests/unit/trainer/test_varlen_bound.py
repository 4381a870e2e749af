"""The varlen kernel's sequence list is sized by the real documents of a batch (trainer/attention.py
varlen_run_bound), not padded to b * t + 1 entries, and the trainer's bound reaches the kernel's boundaries in
every stage it runs, interleaved views included (varlen itself needs CUDA: on CPU the recorded boundaries are
the real `varlen_boundaries`, the attention that runs is the dense reference)."""
from __future__ import annotations

import types

import torch

import trainer.attention as attention
import trainer.model as model
from trainer.attention import build_mask, varlen_boundaries, varlen_run_bound
from trainer.config import model_config
from trainer.schedule import build_rank_stages
from trainer.partition import StageSpec
from trainer.train import Trainer


def _runs(seg) -> list:
    starts = torch.ones_like(seg, dtype=torch.bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    return torch.nonzero(starts.reshape(-1)).reshape(-1).tolist() + [seg.numel()]


def _packed(b, t, docs_per_row, seed=0):
    g = torch.Generator().manual_seed(seed)
    seg = torch.zeros(b, t, dtype=torch.long)
    for r in range(b):
        cuts = torch.sort(torch.randperm(t - 1, generator=g)[:docs_per_row - 1] + 1).values
        seg[r] = torch.bucketize(torch.arange(t), cuts, right=True) + 1
    return seg


def test_bound_follows_the_documents_not_b_times_t():
    b, t = 8, 2048
    seg = _packed(b, t, 7)
    bound = varlen_run_bound(seg)
    runs = len(_runs(seg)) - 1
    assert runs <= bound < 2 * max(runs, 64) and bound & (bound - 1) == 0  # a power of two above the count
    assert bound == 64 and b * t == 16384  # ~56 documents: 65 entries instead of 16,385
    cu = varlen_boundaries(seg, bound).tolist()
    assert cu[:runs + 1] == _runs(seg) and set(cu[runs + 1:]) == {b * t}  # the padding: empty sequences
    # per micro-batch: the densest chunk decides; never more than a chunk can hold
    dense = torch.cat([_packed(2, 64, 2), _packed(2, 64, 60, seed=1)])
    assert varlen_run_bound(dense, microbatches=2) == 2 * 64 and varlen_run_bound(dense[:2], 1) == 64
    assert varlen_run_bound(torch.arange(16).reshape(2, 8), 1) == 16  # every token its own run: b * t


def _record_varlen(monkeypatch) -> list:
    """Let GPTStage resolve `varlen` on CPU and record the cu_seqlens its forward builds for each micro-batch."""
    seen = []
    real = attention.build_mask

    def recording(segment_ids, impl, varlen_bound=None):
        assert impl == "varlen"
        seen.append((varlen_bound, real(segment_ids, impl, varlen_bound).cu_seqlens.numel()))
        return real(segment_ids, "sdpa")

    monkeypatch.setattr(model, "resolve_impl", lambda impl, device: impl)
    monkeypatch.setattr(attention, "resolve_impl", lambda impl, device: impl)  # Trainer._bound_varlen's import
    monkeypatch.setattr(model, "build_mask", recording)
    return seen


def test_the_trainers_bound_reaches_every_stage_and_view(monkeypatch):
    """Interleaved pipeline: the trainer bounds the owner, the schedule runs its views (trainer/model.py
    stage_view); before the bound was one object shared by both, a view had no bound at all: AttributeError in
    the pipeline's shape inference on one rank, the next stage's rank waiting for it forever."""
    seen = _record_varlen(monkeypatch)
    cfg = model_config("tiny", seq_len=128, vocab_size=64, n_layers=3, d_model=16, n_heads=2)
    specs = [StageSpec(0, (), True, False, (0,)), StageSpec(2, (), False, True, (2,))]
    owner, views = build_rank_stages(cfg, specs, 0, torch.device("cpu"), attention="varlen")
    t = Trainer.__new__(Trainer)
    t.module, t.env = owner, types.SimpleNamespace(device=torch.device("cpu"))
    t.cfg = types.SimpleNamespace(parallel=types.SimpleNamespace(microbatches=2))
    seg = _packed(4, 128, 3)
    t._bound_varlen(seg)
    bound = varlen_run_bound(seg, 2)
    assert bound == 64 and owner.varlen_bound.value == 64
    mb = seg[:2]  # one micro-batch: 2 x 128 tokens, unbounded 257 entries
    hidden, _ = views[0](torch.zeros_like(mb), torch.zeros_like(mb), mb)
    views[1](hidden, mb)
    assert seen == [(64, 65), (64, 65)]  # both virtual stages: the bound, bound + 1 boundaries
    t._bound_varlen(torch.arange(512).reshape(4, 128))  # every token its own document: a micro-batch holds 256
    views[1](hidden, mb)
    assert seen[-1] == (256, 257)


def test_without_a_bound_a_stage_pads_to_b_times_t(monkeypatch):
    seen = _record_varlen(monkeypatch)
    cfg = model_config("tiny", seq_len=128, vocab_size=64, n_layers=1, d_model=16, n_heads=2)
    stage = model.GPTStage(cfg, [0], first=True, last=True, attention="varlen")
    seg = _packed(2, 128, 3)
    stage(torch.zeros_like(seg), torch.zeros_like(seg), seg)
    assert seen == [(None, 2 * 128 + 1)]


def test_gpu_check_attention_says_varlen_is_skipped_on_cpu_and_reports_the_bound(capsys):
    import time

    from tests.unit.trainer.test_gpu_check import _load
    out = _load().section_attention(types.SimpleNamespace(tiny=True), torch.device("cpu"), time.monotonic() + 60,
                               lambda result: None)
    assert "[attention] varlen skipped: needs a CUDA device" in capsys.readouterr().out
    for row in out["mixes"].values():
        assert row["varlen"] == {"status": "skipped", "reason": "needs a CUDA device"}
        assert row["documents"] <= row["varlen_sequences"] < row["varlen_sequences_unbounded"] == 2 * 64
