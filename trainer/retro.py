"""RETRO-style retrieval for the GPT: a neighbour encoder and chunked cross-attention (CCA), plus the reader of
the neighbour sidecar (`pileprep retrieval neighbours`) aligned with a shard record.

Training (`--retro-sidecar DIR --retro-layers 1,3`): `open_sidecar` checks the sidecar against the shard
generation before any process-group work; the loader reads each example's neighbours through `AlignedSidecar`
(same shard, same record index: data keyed by record, so resume is exact); every chosen layer of a `GPTStage`
owns a `RetroLayer` (its own neighbour encoder and embedding, so any pipeline stage can hold it) applied after
that block, and the neighbours travel with the micro-batch to every stage like segment_ids. `RetroBlock` and
`SidecarReader` are the standalone forms (tests/unit/retrieval/test_retrieval_retro.py).

CCA (Borgeaud et al. 2022, §2.4): the sequence of n tokens is cut into chunks of m; the neighbours of chunk u
were retrieved with chunk u's tokens, so they may only inform tokens *after* chunk u is complete. Tokens
[u·m + m−1, (u+1)·m + m−1) attend to the encoded neighbours of chunk u: shift the sequence left by m−1,
attend chunk-wise, shift back. The first m−1 tokens attend to nothing (output 0). Empty neighbours (id −1,
padding chunks) are masked out; a chunk with none contributes 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from model_contract import DataContract, Manifest, RetrievalSpec, read_records
from model_contract.contract import NEIGHBOUR_DOC_IDS, NEIGHBOUR_TOKENS
from model_contract.retrieval import decode_sidecar


@dataclass(frozen=True)
class RetroSpec:
    """The RETRO options a model stage needs: which layers get chunked cross-attention, the sidecar's chunk and
    neighbour lengths, and the tokenizer's pad id (trainer/args.py `retro_config` builds it from the sidecar)."""
    layers: tuple[int, ...]  # sorted layer indices (`parse_layers`)
    chunk_len: int
    neighbour_len: int
    pad_id: int


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


# ---------------------------------------------------------------------------------------------- training wiring
def open_sidecar(sidecar_dir: str, dataset_manifest: Manifest, seq_len: int) -> tuple:
    """(sidecar manifest, its RetrievalSpec), checked against this shard generation before any process-group
    work: another generation, misaligned files or another tokenizer is a ContractMismatchError naming the
    sidecar (the CLI's exit 2)."""
    from model_contract import ContractMismatchError, load_manifest  # noqa: PLC0415
    from model_contract.retrieval import check_sidecar  # noqa: PLC0415

    try:
        side = load_manifest(sidecar_dir)
    except FileNotFoundError:
        raise ContractMismatchError([f"--retro-sidecar {sidecar_dir}: no manifest.json (not a neighbours "
                                     f"sidecar: run `pileprep retrieval neighbours`)"]) from None
    try:
        check_sidecar(dataset_manifest, side)
        spec = side.contract.retrieval
        if spec is None:
            raise ContractMismatchError(["the manifest declares no retrieval spec (not a neighbours sidecar)"])
        if side.contract.seq_len != seq_len or seq_len % spec.chunk_len:
            raise ContractMismatchError([f"built for seq_len {side.contract.seq_len} (chunk_len "
                                         f"{spec.chunk_len}), the model's is {seq_len}"])
    except ContractMismatchError as e:
        raise ContractMismatchError([f"--retro-sidecar {sidecar_dir}: {m}" for m in e.mismatches]) from None
    return side, spec


class AlignedSidecar:
    """Random access to the sidecar record aligned with (dataset shard path, record index): the loader asks for
    exactly the records it trains on, so neighbours are data keyed by record (resume stays exact)."""

    def __init__(self, sidecar_dir: str, sidecar_manifest: Manifest, verify: bool = True):
        from model_contract import manifest_path, resolve_shard_path  # noqa: PLC0415

        mfile = manifest_path(sidecar_dir)
        aligned = sidecar_manifest.retrieval.aligned
        self.contract: DataContract = sidecar_manifest.contract
        self.paths = {a.shard: resolve_shard_path(mfile, a.sidecar) for a in aligned}
        self.verify = verify
        self._offsets: dict = {}
        self._files: dict = {}

    def get(self, shard_path: str, record: int) -> dict:
        from model_contract.tfrecord import read_record_at, record_offsets  # noqa: PLC0415

        path = self.paths[shard_path]
        if path not in self._offsets:
            with open(path, "rb") as f:
                self._offsets[path] = record_offsets(f, verify=self.verify, name=path)
        f = self._files.get(path)
        if f is None:
            if len(self._files) >= 8:
                self._files.pop(next(iter(self._files))).close()
            f = self._files[path] = open(path, "rb", buffering=0)
        nb = decode_sidecar(read_record_at(f, int(self._offsets[path][record]), verify=self.verify, name=path),
                            self.contract)
        return {NEIGHBOUR_TOKENS: nb[NEIGHBOUR_TOKENS], NEIGHBOUR_DOC_IDS: nb[NEIGHBOUR_DOC_IDS]}

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


class RetroLayer(nn.Module):
    """The RETRO part of one chosen decoder layer: its own neighbour encoder (with its own token embedding, so a
    pipeline stage that owns the layer needs no other stage's weights) and chunked cross-attention."""

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, chunk_len: int, neighbour_len: int):
        super().__init__()
        self.emb = nn.Embedding(vocab_size, d_model)
        self.encoder = NeighbourEncoder(d_model, n_heads, 1, neighbour_len)
        self.cca = ChunkedCrossAttention(d_model, n_heads, chunk_len)

    def reset_parameters(self, generator: torch.Generator, std: float) -> None:
        """Deterministic per layer (every rank builds the same weights for the layers it owns)."""
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif "norm" in name:
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=generator, device=generator.device) * std)

    def forward(self, x: torch.Tensor, neighbour_tokens: torch.Tensor, neighbour_doc_ids: torch.Tensor,
                pad_id: int) -> torch.Tensor:
        # Real ids are always < vocab; the clamp keeps the pipeline's forward metadata inference (which runs later
        # stages on torch.empty inputs: arbitrary integers) from indexing outside the embedding.
        neighbour_tokens = neighbour_tokens.clamp(0, self.emb.num_embeddings - 1)
        encoded = self.encoder(neighbour_tokens, self.emb, pad_id)
        return self.cca(x, encoded, neighbour_inputs(neighbour_tokens, neighbour_doc_ids, pad_id))


def parse_layers(text: str, n_layers: int) -> tuple:
    """'1,3' -> (1, 3); each a layer index of the model."""
    try:
        layers = tuple(sorted({int(t) for t in text.split(",") if t.strip()}))
    except ValueError:
        raise ValueError(f"--retro-layers {text!r}: comma-separated layer indices, e.g. 1,3") from None
    bad = [i for i in layers if not 0 <= i < n_layers]
    if bad:
        raise ValueError(f"--retro-layers {text!r}: layers {bad} outside 0..{n_layers - 1}")
    return layers
