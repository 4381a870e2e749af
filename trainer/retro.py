"""RETRO-style retrieval for the GPT: a neighbour encoder and chunked cross-attention (CCA), plus the reader of
the neighbour sidecar (`pileprep retrieval neighbours`) aligned with a shard record.

Not yet wired into `trainer/train.py` (the trainer is being refactored); this module is self-contained: a
`RetroBlock` wraps a decoder block's output with CCA, so a stage that owns a chosen layer applies it after that
block, and the neighbours travel with the micro-batch to every stage that has such a layer.

CCA (Borgeaud et al. 2022, §2.4): the sequence of n tokens is cut into chunks of m; the neighbours of chunk u
were retrieved with chunk u's tokens, so they may only inform tokens *after* chunk u is complete. Tokens
[u·m + m−1, (u+1)·m + m−1) attend to the encoded neighbours of chunk u: shift the sequence left by m−1,
attend chunk-wise, shift back. The first m−1 tokens attend to nothing (output 0). Empty neighbours (id −1,
padding chunks) are masked out; a chunk with none contributes 0.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from model_contract import DataContract, Manifest, RetrievalSpec, read_records
from model_contract.contract import NEIGHBOUR_DOC_IDS, NEIGHBOUR_TOKENS
from model_contract.retrieval import decode_sidecar


class NeighbourEncoder(nn.Module):
    """Bidirectional transformer over each neighbour (chunk + continuation), sharing the decoder's embedding."""

    def __init__(self, d_model: int, n_heads: int, n_layers: int = 1, max_len: int = 128):
        super().__init__()
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, dropout=0.0, batch_first=True,
                                           norm_first=True, activation="gelu")
        self.layers = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, tokens: torch.Tensor, embed: nn.Embedding, pad_id: int) -> torch.Tensor:
        """tokens [B, L, k, r] → [B, L, k·r, d]."""
        b, l, k, r = tokens.shape
        flat = tokens.reshape(b * l * k, r)
        x = embed(flat) + self.pos(torch.arange(r, device=tokens.device))
        pad = flat == pad_id
        pad = pad & ~pad.all(dim=1, keepdim=True)  # an all-padding neighbour keeps its keys (masked in CCA)
        x = self.norm(self.layers(x, src_key_padding_mask=pad))
        return x.reshape(b, l, k * r, -1)


class ChunkedCrossAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, chunk_len: int):
        super().__init__()
        self.n_heads = n_heads
        self.chunk_len = chunk_len
        self.norm = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, d_model)
        self.kv = nn.Linear(d_model, 2 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, encoded: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """x [B, n, d]; encoded [B, L, k·r, d]; present [B, L, k·r] bool (key usable). Returns the residual."""
        b, n, d = x.shape
        m = self.chunk_len
        l = n // m
        h = self.norm(x)
        shifted = torch.cat([h[:, m - 1:], h.new_zeros(b, m - 1, d)], dim=1).reshape(b * l, m, d)
        kv = encoded.reshape(b * l, -1, d)
        hd = d // self.n_heads
        q = self.q(shifted).view(b * l, m, self.n_heads, hd).transpose(1, 2)
        k, v = (z.view(b * l, -1, self.n_heads, hd).transpose(1, 2) for z in self.kv(kv).split(d, dim=2))
        keep = present.reshape(b * l, 1, 1, -1)
        any_key = keep.any(dim=-1, keepdim=True)
        mask = keep | ~any_key  # rows with no key attend to everything, then are zeroed (no NaN)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = self.proj(y.transpose(1, 2).reshape(b * l, m, d))
        y = torch.where(any_key.reshape(b * l, 1, 1), y, torch.zeros_like(y)).reshape(b, n, d)
        # shift back: output for position i came from shifted row i - (m - 1)
        return torch.cat([y.new_zeros(b, m - 1, d), y[:, :n - (m - 1)]], dim=1)


class RetroBlock(nn.Module):
    """A decoder block followed by CCA on the encoded neighbours (RETRO applies it in every 3rd layer)."""

    def __init__(self, block: nn.Module, d_model: int, n_heads: int, chunk_len: int):
        super().__init__()
        self.block = block
        self.cca = ChunkedCrossAttention(d_model, n_heads, chunk_len)

    def forward(self, x, mask, encoded, present):
        x = self.block(x, mask)
        return x + self.cca(x, encoded, present)


def neighbour_inputs(neighbour_tokens: torch.Tensor, neighbour_doc_ids: torch.Tensor, pad_id: int):
    """present [B, L, k·r]: keys of real neighbours (doc id >= 0) that are not padding tokens."""
    b, l, k, r = neighbour_tokens.shape
    real = (neighbour_doc_ids >= 0)[..., None].expand(b, l, k, r)
    return (real & (neighbour_tokens != pad_id)).reshape(b, l, k * r)


class SidecarReader:
    """Neighbours for (shard index, record index) of the dataset, checked against the shard manifest."""

    def __init__(self, dataset_manifest: Manifest, sidecar_dir: str, sidecar_manifest: Manifest,
                 expected: Optional[RetrievalSpec] = None):
        from model_contract.retrieval import check_sidecar  # noqa: PLC0415

        check_sidecar(dataset_manifest, sidecar_manifest)
        self.contract: DataContract = sidecar_manifest.contract
        if expected is not None:
            problems = self.contract.retrieval.mismatches(expected)
            if problems:
                from model_contract import ContractMismatchError  # noqa: PLC0415

                raise ContractMismatchError(problems)
        self.paths = [f"{sidecar_dir.rstrip('/')}/{s.path}" for s in sidecar_manifest.shards]
        self._cache: dict = {}

    def get(self, shard: int, record: int) -> dict:
        if shard not in self._cache:
            self._cache = {shard: list(read_records(self.paths[shard]))}
        nb = decode_sidecar(self._cache[shard][record], self.contract)
        return {NEIGHBOUR_TOKENS: torch.from_numpy(np.ascontiguousarray(nb[NEIGHBOUR_TOKENS])),
                NEIGHBOUR_DOC_IDS: torch.from_numpy(np.ascontiguousarray(nb[NEIGHBOUR_DOC_IDS]))}
