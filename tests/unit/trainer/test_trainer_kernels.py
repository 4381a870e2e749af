"""Attention kernels and the chunked loss compute what the dense reference computes (in-process, CPU)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainer.attention import build_mask, attend, dense_mask, resolve_impl, varlen_boundaries
from trainer.config import model_config
from trainer.loss import IGNORE_INDEX, chunked_loss_sum, plain_loss_sum
from trainer.model import build_gpt

CFG = model_config("tiny", seq_len=32, vocab_size=64, n_layers=2, d_model=32, n_heads=2)


def _segments():
    # Three documents, one cut by the row end, padding (segment 0) at the end of row 0; one whole-row document.
    return torch.tensor([[1] * 7 + [2] * 13 + [3] * 8 + [0] * 4, [5] * 32])


def test_flex_block_mask_matches_dense_sdpa():
    """flex_attention with the block mask from segment_ids gives the dense-mask SDPA output (forward; CPU flex
    has no backward)."""
    torch.manual_seed(0)
    seg = _segments()
    q, k, v = (torch.randn(2, 2, 32, 16) for _ in range(3))
    ref = attend(q, k, v, build_mask(seg, "sdpa"))
    got = attend(q, k, v, build_mask(seg, "flex"))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # and the reference is not trivially the unmasked result
    assert not torch.allclose(ref, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-3)


def test_model_forward_equal_across_attention_impls():
    seg = _segments()
    ids = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(32).expand(2, 32)
    ref_model = build_gpt(CFG)
    flex_model = build_gpt(CFG)
    flex_model.attention = "flex"
    with torch.no_grad():
        torch.testing.assert_close(flex_model(ids, pos, seg), ref_model(ids, pos, seg), rtol=1e-4, atol=1e-5)


def test_varlen_boundaries_split_rows_and_documents():
    seg = _segments()
    cu = varlen_boundaries(seg).tolist()
    assert len(cu) == seg.numel() + 1  # fixed: the most runs a batch can hold, padded with the total
    assert cu[:6] == [0, 7, 20, 28, 32, 64] and set(cu[6:]) == {64}
    assert dense_mask(seg)[0, 0, 10, 7] and not dense_mask(seg)[0, 0, 10, 6]


def _nonzero_boundaries(seg):
    starts = torch.ones_like(seg, dtype=torch.bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    return torch.nonzero(starts.reshape(-1)).reshape(-1).tolist() + [seg.numel()]


def test_varlen_boundaries_compile_once_without_a_host_sync():
    """One graph for every document count: traced with fullgraph (a host sync such as torch.nonzero's
    data-dependent shape cannot be traced) and dynamic=False, 12 micro-batches with 1 to 12 documents per row
    compile once; the runs equal the nonzero reference and the padding is empty sequences."""
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()
    counter = CompileCounter()
    fn = torch.compile(varlen_boundaries, backend=counter, fullgraph=True, dynamic=False)
    g = torch.Generator().manual_seed(0)
    for docs in range(1, 13):
        cuts = torch.sort(torch.randperm(31, generator=g)[:docs - 1] + 1).values
        seg = torch.zeros(2, 32, dtype=torch.long)
        for r in range(2):
            seg[r] = torch.bucketize(torch.arange(32), cuts, right=True) + 1
        seg[1, -3:] = 0  # padding
        cu = fn(seg)
        runs = _nonzero_boundaries(seg)
        assert cu.shape == (65,) and cu[:len(runs)].tolist() == runs and set(cu[len(runs):].tolist()) <= {64}
    assert counter.frame_count == 1


def test_selective_checkpointing_keeps_the_varlen_kernel_output():
    from trainer.attention import varlen_attention_op
    from trainer.fsdp import _save_list
    op = varlen_attention_op()
    if op is None:
        pytest.skip("this torch has no varlen attention op")
    assert op in _save_list()


def test_varlen_call_form_is_detected_from_this_torch():
    import inspect
    from torch.nn.attention.varlen import varlen_attn
    from trainer.attention import _varlen_causal_kwargs
    kw = dict(_varlen_causal_kwargs())
    assert set(kw) <= set(inspect.signature(varlen_attn).parameters)
    assert kw in ({"window_size": (-1, 0)}, {"is_causal": True})


def test_auto_is_sdpa_on_cpu_and_varlen_needs_cuda():
    assert resolve_impl("auto", torch.device("cpu")) == "sdpa"
    with pytest.raises(ValueError, match="varlen needs a CUDA"):
        resolve_impl("varlen", torch.device("cpu"))


def test_chunked_loss_equals_plain_cross_entropy_value_and_grads():
    torch.manual_seed(0)
    h = torch.randn(3, 10, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    y = torch.randint(0, 50, (3, 10))
    y[0, :4] = IGNORE_INDEX
    ref = plain_loss_sum(h @ w.T, y)
    gh, gw = torch.autograd.grad(ref, (h, w))
    got = chunked_loss_sum(h, w, y, chunk_tokens=7)  # 30 tokens: chunks of 7 with a remainder
    ch, cw = torch.autograd.grad(got, (h, w))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ch, gh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(cw, gw, rtol=1e-5, atol=1e-6)


def test_chunked_model_loss_equals_logits_path():
    """The last stage in loss="chunked" mode returns the same loss sum and parameter gradients."""
    ids = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(2))
    labels = torch.roll(ids, -1, 1)
    labels[:, -1] = IGNORE_INDEX
    pos, seg = torch.arange(32).expand(2, 32), _segments()
    a, b = build_gpt(CFG), build_gpt(CFG)
    b.loss_mode, b.loss_chunk_tokens = "chunked", 20
    la = plain_loss_sum(a(ids, pos, seg), labels)
    lb = b(ids, pos, seg, labels)
    assert lb.shape == (1,)
    la.backward()
    lb.sum().backward()
    torch.testing.assert_close(lb[0], la, rtol=1e-5, atol=1e-5)
    for (n, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(pb.grad, pa.grad, rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.parametrize("name,peak", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 NVL", 835.0),
    ("NVIDIA H200", 989.0), ("NVIDIA H200 NVL", 835.0), ("NVIDIA A100-SXM4-40GB", 312.0),
    ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA A100 80GB PCIe", 312.0), ("NVIDIA A100-PCIE-40GB", 312.0),
    ("NVIDIA GeForce RTX 3090", None),
])
def test_peak_flops_by_exact_device_name(name, peak):
    from trainer.metrics import peak_tflops_for_name
    assert peak_tflops_for_name(name) == peak


def test_metrics_accept_device_loss_without_sync():
    from trainer.metrics import MetricsLogger
    m = MetricsLogger(1e6, 1, torch.device("cpu"), is_writer=False)
    for v in (1.0, 3.0):
        m.record_step(loss=torch.tensor(v), step_seconds=0.1, read=0, decode=0, h2d=0, tokens=10)
    rec = m.flush(2, 1e-3, torch.tensor(0.5))
    assert rec["loss"] == pytest.approx(2.0) and rec["grad_norm"] == pytest.approx(0.5)


def test_compile_per_block_with_activation_checkpointing_keeps_names_and_gradients():
    """Per-block compile (aot_eager here: the same Dynamo/AOT graphs without a C++ toolchain) composes with
    selective activation checkpointing and the document mask object; names and gradients are unchanged."""
    from trainer.fsdp import apply_activation_checkpointing
    from trainer.model import compile_blocks
    ids = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(3))
    pos, seg = torch.arange(32).expand(2, 32), _segments()
    ref, m = build_gpt(CFG), build_gpt(CFG)
    ref.loss_mode = m.loss_mode = "chunked"
    apply_activation_checkpointing(m, "selective")
    compile_blocks(m, backend="aot_eager")
    ref(ids, pos, seg, ids).sum().backward()
    m(ids, pos, seg, ids).sum().backward()
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in ref.named_parameters()]
    for (n, a), (_, b) in zip(ref.named_parameters(), m.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=n)
