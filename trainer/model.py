"""A GPT decoder (nanoGPT-shaped) whose attention respects packed-document boundaries.

The model is written as *stages*: `GPTStage(cfg, layers, first, last)` holds the embeddings when `first`, the
blocks whose indices are in `layers`, and the final LayerNorm + vocabulary head when `last`. The whole model
is simply the stage that is both first and last, so pipeline stages are the same code, and parameter names
(`blocks.7.attn.qkv.weight`) are the same in every layout: checkpoints move between pipeline layouts.

Attention mask: position i attends to j iff j <= i and segment_ids[i] == segment_ids[j]. Packed documents
never see each other; padding (segment 0) only sees padding, so no row is empty (no NaN).

Attention kernels (`trainer.attention`): dense-mask SDPA (the CPU path and the reference), flex attention with a
block mask, or varlen FlashAttention; the mask is built once per micro-batch in the stage's forward. The fused
`qkv` projection stores its output rows head-major ([head, q|k|v, head_dim]), so tensor parallelism can shard
it column-wise into whole heads (`trainer.tensor_parallel`) with the same parameter names in every layout.

Loss: with `loss="chunked"` the last stage takes the labels as a fourth input and returns the summed token loss
(`trainer.loss.chunked_loss_sum`), never materialising [B, T, V] fp32 logits; `loss="logits"` returns logits.

Initialisation is per unit from a generator seeded by (seed, unit): every rank builds bit-identical weights
for the layers it owns without building the rest of the model.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainer.attention import DocumentMask, VarlenBound, attend, build_mask, resolve_impl
from trainer.config import ModelConfig
from trainer.loss import IGNORE_INDEX, chunked_loss_sum, plain_loss_sum

if TYPE_CHECKING:
    from trainer.retro import RetroSpec


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)  # output rows head-major: [head, q|k|v, head_dim]
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor, mask) -> torch.Tensor:
        b, t, _ = x.shape
        # Local heads: all of them, or this rank's share under tensor parallelism.
        q, k, v = self.qkv(x).view(b, t, -1, 3, self.head_dim).unbind(3)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        if not isinstance(mask, DocumentMask):  # a bare dense mask (older callers, profiling)
            mask = DocumentMask("sdpa", dense=mask)
        y = attend(q, k, v, mask)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.out = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-LayerNorm transformer block."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.mlp = MLP(cfg)

        self.ac_mode = "none"  # activation checkpointing: none | selective | full (trainer.fsdp)

    def _forward(self, x: torch.Tensor, mask) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))

    def forward(self, x: torch.Tensor, mask) -> torch.Tensor:
        if self.ac_mode == "none":
            return self._forward(x, mask)
        from trainer.fsdp import checkpointed
        return checkpointed(self._forward, self.ac_mode, x, mask)


def _generator(seed: int, unit: str, device: Optional[torch.device] = None) -> torch.Generator:
    # A stable per-unit seed (Python's hash() is salted per process, so derive it by hand). A CPU generator by
    # default (bit-identical weights on every rank and device); benchmarks initialise on the device itself.
    h = 1469598103934665603
    for ch in f"{seed}/{unit}".encode():
        h = ((h ^ ch) * 1099511628211) & (2**63 - 1)
    return torch.Generator(device=device or "cpu").manual_seed(h)


def _randn(shape, g: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=g, device=g.device)


def init_block_(block: Block, cfg: ModelConfig, seed: int, index: int,
                init_device: Optional[torch.device] = None) -> None:
    g = _generator(seed, f"block{index}", init_device)
    resid_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)  # GPT-2: scale residual projections
    with torch.no_grad():
        for name, p in block.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif name.startswith("ln"):
                p.fill_(1.0)
            else:
                std = resid_std if name in ("attn.proj.weight", "mlp.out.weight") else cfg.init_std
                w = _randn(p.shape, g) * std
                p.copy_(qkv_head_major(w, cfg) if name == "attn.qkv.weight" else w)


def qkv_head_major(w: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """Reorder [q; k; v] rows (each [H * head_dim]) into [head, q|k|v, head_dim] order."""
    return w.reshape(3, cfg.n_heads, cfg.head_dim, *w.shape[1:]).transpose(0, 1).reshape(w.shape)


class GPTStage(nn.Module):
    """A contiguous slice of the GPT. first: embeddings; last: final LN + head; blocks: `layers`.

    Inputs/outputs:
      first stage:  (input_ids, positions, segment_ids)
      other stages: (hidden, segment_ids)
      non-last stages return (hidden, segment_ids); the last returns logits [B, T, vocab].
    """

    def __init__(self, cfg: ModelConfig, layers: Iterable[int], first: bool, last: bool, seed: int = 0,
                 attention: str = "sdpa", loss: str = "logits", loss_chunk_tokens: int = 4096,
                 retro: Optional[RetroSpec] = None, init_device: Optional[torch.device] = None):
        """init_device: build and initialise the parameters on that device with a generator there (benchmarks:
        no model-sized CPU init and copy; the weights then differ from the CPU-seeded ones)."""
        super().__init__()
        if init_device is not None:
            with torch.device(init_device):
                self._build(cfg, layers, first, last, seed, attention, loss, loss_chunk_tokens, retro, init_device)
            return
        self._build(cfg, layers, first, last, seed, attention, loss, loss_chunk_tokens, retro, None)

    def _build(self, cfg, layers, first, last, seed, attention, loss, loss_chunk_tokens, retro, init_device):
        if loss not in ("logits", "chunked"):
            raise ValueError(f"unknown loss mode {loss!r} (logits | chunked)")
        self.cfg, self.first, self.last = cfg, first, last
        self.attention, self.loss_mode, self.loss_chunk_tokens = attention, loss, loss_chunk_tokens
        self.varlen_bound = VarlenBound()  # shared with the views (stage_view); trainer/train.py sets it per step
        self.layer_ids = list(layers)
        if first:
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
            self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        # ModuleDict keyed by the global layer index keeps parameter names identical in every layout.
        self.blocks = nn.ModuleDict({str(i): Block(cfg) for i in self.layer_ids})
        # RETRO (trainer.retro.RetroSpec): the neighbours travel with
        # the micro-batch through every stage (like segment_ids), the layers named here add chunked cross-attention.
        self.retro_spec = retro
        if retro is not None:
            from trainer.retro import RetroLayer  # noqa: PLC0415
            self.retro = nn.ModuleDict({
                str(i): RetroLayer(cfg.vocab_size, cfg.d_model, cfg.n_heads, retro.chunk_len,
                                   retro.neighbour_len) for i in self.layer_ids if i in retro.layers})
        if last:
            self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters(seed, init_device)
        if first and last and cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    def reset_parameters(self, seed: int, init_device: Optional[torch.device] = None) -> None:
        cfg, dev = self.cfg, init_device
        with torch.no_grad():
            emb = _randn((cfg.vocab_size, cfg.d_model), _generator(seed, "tok_emb", dev)) * cfg.init_std
            if self.first:
                self.tok_emb.weight.copy_(emb)
                self.pos_emb.weight.copy_(
                    _randn((cfg.seq_len, cfg.d_model), _generator(seed, "pos_emb", dev)) * cfg.init_std)
            for i in self.layer_ids:
                init_block_(self.blocks[str(i)], cfg, seed, i, dev)
                if self.retro_spec is not None and str(i) in self.retro:
                    self.retro[str(i)].reset_parameters(_generator(seed, f"retro{i}", dev), cfg.init_std)
            if self.last:
                self.ln_f.weight.fill_(1.0)
                self.ln_f.bias.zero_()
                if cfg.tie_embeddings:  # a separate copy on a later stage starts equal to the embedding
                    self.head.weight.copy_(emb)
                else:
                    self.head.weight.copy_(
                        _randn((cfg.vocab_size, cfg.d_model), _generator(seed, "head", dev)) * cfg.init_std)

    def forward(self, *args):
        """(input_ids, positions, segment_ids[, labels]) on the first stage, (hidden, segment_ids[, labels])
        after it; labels travel with the activations when loss="chunked" and the last stage returns the loss
        sum, shape [1] (so the pipeline can concatenate micro-batch outputs)."""
        chunked = self.loss_mode == "chunked"
        labels = args[-1] if chunked else None
        args = args[:-1] if chunked else args
        retro = self.retro_spec is not None
        nb = args[-2:] if retro else ()
        args = args[:-2] if retro else args
        if self.first:
            input_ids, positions, segment_ids = args
            # fp32 residual stream in every layout: under FSDP2 the embedding weights are bf16 copies
            # (trainer/fsdp.py mixed_precision); a no-op with fp32 weights
            x = (self.tok_emb(input_ids) + self.pos_emb(positions)).float()
        else:
            x, segment_ids = args
        mask = build_mask(segment_ids, resolve_impl(self.attention, segment_ids.device), self.varlen_bound.value)
        for key, block in self.blocks.items():
            x = block(x, mask)
            if retro and key in self.retro:
                x = x + self.retro[key](x, nb[0], nb[1], self.retro_spec.pad_id)
        if self.last:
            x = self.ln_f(x)
            if chunked:
                return chunked_loss_sum(x, self.head.weight, labels, self.loss_chunk_tokens).reshape(1)
            return self.head(x)
        return (x, segment_ids, *nb, labels) if chunked else (x, segment_ids, *nb)

    def tied_weight(self) -> Optional[nn.Parameter]:
        """The parameter that is tied across the first and last stage (None if untied or on a middle stage)."""
        if not self.cfg.tie_embeddings:
            return None
        if self.first:
            return self.tok_emb.weight
        if self.last:
            return self.head.weight
        return None


def stage_view(parent: GPTStage, layers: Iterable[int], first: bool, last: bool) -> GPTStage:
    """A stage that *shares* `parent`'s modules for a subset of its units (interleaved pipeline schedules: one
    rank runs several virtual stages). The parent owns the parameters, their names and the optimizer; the views
    own nothing and are what the pipeline runs."""
    v = GPTStage.__new__(GPTStage)
    nn.Module.__init__(v)
    v.cfg, v.first, v.last = parent.cfg, first, last
    v.attention, v.loss_mode, v.loss_chunk_tokens = parent.attention, parent.loss_mode, parent.loss_chunk_tokens
    v.varlen_bound = parent.varlen_bound  # the same object: the trainer sets the owner's, the views run with it
    v.layer_ids = list(layers)
    v.retro_spec = parent.retro_spec
    if parent.retro_spec is not None:
        v.retro = nn.ModuleDict({str(i): parent.retro[str(i)] for i in v.layer_ids if str(i) in parent.retro})
    if first:
        v.tok_emb, v.pos_emb = parent.tok_emb, parent.pos_emb
    v.blocks = nn.ModuleDict({str(i): parent.blocks[str(i)] for i in v.layer_ids})
    if last:
        v.ln_f, v.head = parent.ln_f, parent.head
    return v


def build_gpt(cfg: ModelConfig, seed: int = 0, init_device: Optional[torch.device] = None) -> GPTStage:
    """The whole, unpipelined model."""
    return GPTStage(cfg, range(cfg.n_layers), first=True, last=True, seed=seed, init_device=init_device)


token_loss_sum = plain_loss_sum  # the name train.py uses


def compile_blocks(stage: GPTStage, backend: str = "inductor") -> GPTStage:
    """torch.compile each block in place (`Module.compile` keeps parameter names, so checkpoints, FSDP and the
    pipeline stage see the same module tree). Per block rather than whole-model: one compiled graph reused by
    every layer, it composes with pipeline stages and activation checkpointing, and compile time does not grow
    with depth."""
    for block in stage.blocks.values():
        block.compile(dynamic=False, backend=backend)
    return stage
