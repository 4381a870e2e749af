"""Document-masked causal attention on three kernels, chosen once per model: dense SDPA, flex, varlen.

Packed examples hold several documents; position i may attend to j iff j <= i and both are in the same
document (segment_ids equal; padding, segment 0, only sees padding, so no row is empty). Three ways to compute
exactly that:

- ``sdpa``: a dense boolean ``[B, 1, T, T]`` mask into ``scaled_dot_product_attention``. Works everywhere (the CPU
  path and the reference), but a dense mask rules out FlashAttention and computes every tile.
- ``flex``: ``flex_attention`` with a ``BlockMask`` built from ``segment_ids``: tiles wholly outside a document
  or above the diagonal are skipped, so the work follows the document lengths. Compiled on CUDA; on CPU torch
  runs it eagerly and forward-only (no backward), which is enough for the equality test.
- ``varlen``: FlashAttention's variable-length kernel over the flattened batch with cumulative document
  boundaries (CUDA only).

The mask is built once per micro-batch (``build_mask``), in the stage's forward, and shared by every block: the
block mask costs a pass over ``T^2 / block^2`` tiles, not per layer.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F

IMPLS = ("auto", "sdpa", "flex", "varlen")


def resolve_impl(impl: str, device: torch.device) -> str:
    """``auto`` is flex on CUDA and dense SDPA elsewhere (flex has no CPU backward)."""
    if impl not in IMPLS:
        raise ValueError(f"unknown attention {impl!r}; choose one of {', '.join(IMPLS)} (--attention)")
    if impl == "auto":
        return "flex" if device.type == "cuda" else "sdpa"
    if impl == "varlen" and device.type != "cuda":
        raise ValueError("--attention varlen needs a CUDA device (FlashAttention); use sdpa or flex on CPU")
    return impl


def dense_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """Boolean [B, 1, T, T]: causal and same segment."""
    t = segment_ids.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=segment_ids.device).tril()
    same = segment_ids[:, :, None] == segment_ids[:, None, :]
    return (same & causal)[:, None]


@functools.lru_cache(maxsize=None)
def _compiled(name: str):
    from torch.nn.attention import flex_attention as fa
    fn = getattr(fa, name)
    return torch.compile(fn, dynamic=False)


def flex_block_mask(segment_ids: torch.Tensor, block_size: int = 128):
    """The document-causal BlockMask. On CUDA `create_block_mask` itself is compiled (`torch.compile` of the
    function: the form torch 2.11-2.13 all support; its `_compile=True` argument is deprecated in 2.13)."""
    from torch.nn.attention.flex_attention import create_block_mask
    b, t = segment_ids.shape
    seg = segment_ids

    def document_causal(bi, h, q, k):
        return (seg[bi, q] == seg[bi, k]) & (k <= q)

    build = _compiled("create_block_mask") if seg.device.type == "cuda" else create_block_mask
    return build(document_causal, b, None, t, t, device=seg.device, BLOCK_SIZE=min(block_size, t))


def varlen_boundaries(segment_ids: torch.Tensor, bound: Optional[int] = None) -> torch.Tensor:
    """Cumulative start offsets (int32) of every run of equal segment ids in the flattened batch (every row
    starts a new run), padded with the total to a fixed length of `bound` + 1 (default b * t + 1, the most
    runs a batch can hold): the padding entries are empty sequences.

    No host sync and one shape for every micro-batch: the runs are ranked with a cumulative sum and
    scattered (no `torch.nonzero`, whose output length the host must read), so blocks compiled with
    dynamic=False do not recompile as the document count changes."""
    b, t = segment_ids.shape
    n = b * t
    bound = n if bound is None else bound
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    flat = starts.reshape(-1)
    rank = torch.cumsum(flat.to(torch.int32), 0) - 1  # index of each run start among the starts
    # non-starts (and, with a bound below n, starts past it) land in a dump slot that is cut off
    slot = torch.where(flat & (rank < bound), rank, torch.full_like(rank, bound + 1))
    offsets = torch.arange(n, dtype=torch.int32, device=segment_ids.device)
    cu = torch.full((bound + 2,), n, dtype=torch.int32, device=segment_ids.device)
    cu.scatter_(0, slot.to(torch.int64), offsets)
    return cu[: bound + 1]


def varlen_run_bound(segment_ids: torch.Tensor, microbatches: int = 1, floor: int = 64) -> int:
    """A `bound` for `varlen_boundaries` from the real documents of a host batch, without a device sync: the most
    runs (documents and padding, each row starting one) in any of its `microbatches` chunks, rounded up to a
    power of two (at least `floor`, at most the chunk's b * t). Padding the sequence list to b * t + 1 entries
    (~16 K at B=8, T=2048, nearly all empty) costs the kernel a launch slot per entry; the rounding keeps the
    number of distinct shapes (each a recompile of the compiled blocks) to a handful."""
    bound = 1
    for chunk in segment_ids.chunk(microbatches):
        rows, t = chunk.shape
        runs = rows + int((chunk[:, 1:] != chunk[:, :-1]).sum())
        bound = max(bound, min(rows * t, 1 << (max(floor, runs) - 1).bit_length()))
    return bound


def varlen_attention_op():
    """The varlen attention op (for the selective-checkpointing save list), or None on a torch without it."""
    try:
        import torch.nn.attention.varlen  # noqa: F401,PLC0415 - registers torch.ops.torch_attn on import
    except ImportError:
        return None
    ns = getattr(torch.ops, "torch_attn", None)
    op = getattr(ns, "_varlen_attn", None) if ns is not None else None
    return getattr(op, "default", None) if op is not None else None


@functools.lru_cache(maxsize=None)
def _varlen_causal_kwargs() -> tuple:
    """How this torch spells a causal varlen call: `window_size=(-1, 0)` (2.13) or `is_causal=True` (2.11)."""
    import inspect

    from torch.nn.attention.varlen import varlen_attn
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        return (("window_size", (-1, 0)),)
    return (("is_causal", True),)


@dataclass
class VarlenBound:
    """The step's bound on sequences per micro-batch for the varlen kernel (`varlen_run_bound` of the host batch,
    set by trainer/train.py `Trainer._bound_varlen`); None pads to b * t. One mutable object shared by a stage and
    its interleaved views (trainer/model.py `stage_view`): the trainer sets it on the owner, the pipeline runs the
    views. (A plain attribute was missing on the views: the first stage raised AttributeError in the pipeline's
    shape inference while the next waited in `recv_object_list` forever - the hung layouts of commit 76cf715.)

    Every rank that shares a micro-batch (the pp stages and tp shards of one data-parallel replica) reads the same
    host batch (trainer/data.py ShardLoader is keyed by the dp rank alone), so they agree on the bound without a
    collective; replicas may differ, which only picks a different compiled variant locally: cu_seqlens never
    crosses ranks and no collective's shape depends on it."""
    value: Optional[int] = None


@dataclass
class DocumentMask:
    """What one micro-batch's attention needs, for the chosen kernel."""
    impl: str
    dense: Optional[torch.Tensor] = None
    block: Any = None
    cu_seqlens: Optional[torch.Tensor] = None
    max_len: int = 0


def build_mask(segment_ids: torch.Tensor, impl: str, varlen_bound: Optional[int] = None) -> DocumentMask:
    if impl == "sdpa":
        return DocumentMask(impl, dense=dense_mask(segment_ids))
    if impl == "flex":
        return DocumentMask(impl, block=flex_block_mask(segment_ids))
    if impl == "varlen":
        return DocumentMask(impl, cu_seqlens=varlen_boundaries(segment_ids, varlen_bound),
                            max_len=segment_ids.shape[-1])
    raise ValueError(f"attention impl {impl!r} must be resolved first (resolve_impl)")


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: DocumentMask) -> torch.Tensor:
    """q, k, v: [B, H, T, D] -> [B, H, T, D]."""
    if mask.impl == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.dense)
    if mask.impl == "flex":
        if q.device.type == "cuda":
            return _compiled("flex_attention")(q, k, v, block_mask=mask.block)
        from torch.nn.attention.flex_attention import flex_attention
        return flex_attention(q, k, v, block_mask=mask.block)
    if mask.impl == "varlen":
        from torch.nn.attention.varlen import varlen_attn
        b, h, t, d = q.shape
        flat = [z.transpose(1, 2).reshape(b * t, h, d) for z in (q, k, v)]
        out = varlen_attn(*flat, mask.cu_seqlens, mask.cu_seqlens, mask.max_len, mask.max_len,
                          **dict(_varlen_causal_kwargs()))
        return out.reshape(b, t, h, d).transpose(1, 2)
    raise ValueError(f"unknown attention impl {mask.impl!r}")
