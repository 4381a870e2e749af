"""One training batch as the trainer passes it around: named tensors instead of string keys.

The loader (trainer/data.py) yields a dict keyed by the contract's feature names; `Batch.from_loader` is the one
place those strings are read. The input order of a pipeline stage (`inputs`) matches `GPTStage.forward`
(trainer/model.py): ids, positions, segment ids, then the RETRO neighbours, then the labels when the last stage
computes the loss.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class Batch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    segment_ids: torch.Tensor
    labels: torch.Tensor
    neighbour_tokens: Optional[torch.Tensor] = None  # RETRO: [b, chunks, k, r]
    neighbour_doc_ids: Optional[torch.Tensor] = None  # RETRO: [b, chunks, k]

    @classmethod
    def from_loader(cls, d: dict) -> "Batch":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise KeyError(f"batch has features the trainer does not know: {sorted(unknown)}")
        return cls(**d)

    def tensors(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}

    def to(self, device: torch.device, non_blocking: bool = True) -> "Batch":
        return Batch(**{k: v.to(device, non_blocking=non_blocking) for k, v in self.tensors().items()})

    def chunk(self, m: int) -> list:
        """m micro-batches (rows split in order)."""
        parts = {k: v.chunk(m) for k, v in self.tensors().items()}
        return [Batch(**{k: p[i] for k, p in parts.items()}) for i in range(m)]

    def inputs(self, retro: bool, labels_in: bool) -> tuple:
        """The first stage's positional inputs; labels travel through the pipeline when the last stage computes
        the loss (`labels_in`)."""
        out = (self.input_ids, self.positions, self.segment_ids)
        if retro:
            out += (self.neighbour_tokens, self.neighbour_doc_ids)
        return out + (self.labels,) if labels_in else out


@dataclass
class StepResult:
    """One optimizer step's measurements (`Trainer.train_step`). loss and grad_norm stay device tensors: the
    metrics read them once per logging interval (no host sync per step)."""
    loss: torch.Tensor
    lr: float
    grad_norm: torch.Tensor
    wait: float  # host seconds in next(loader)
    h2d: float  # host seconds of the copy (CPU); on CUDA the events below time it on the device
    seconds: float  # host seconds of the whole step (diagnostic: the rates use the interval's wall)
    segment_ids: Optional[torch.Tensor] = None  # the host copy, for the executed-attention estimate
    h2d_events: Optional[tuple[torch.cuda.Event, torch.cuda.Event]] = None  # (start, end) around the copy
    grad_sync: Optional[object] = None  # trainer/grad_sync.py GradSyncTiming: when the dp all-reduce ran
