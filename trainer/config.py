"""Typed configuration for the trainer: one dataclass per component, named model sizes, cost model.

Everything the trainer does flows from a `TrainConfig` built by the CLI (`trainer/train.py`); no module-level
state changes behaviour. Model sizes follow GPT-3 (Brown et al. 2020, table 2.1), with the vocabulary padded
to a multiple of 64 for tensor-core friendly head matmuls.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class ModelConfig:
    name: str = "tiny"
    n_layers: int = 2
    d_model: int = 64
    n_heads: int = 4
    vocab_size: int = 8192
    seq_len: int = 128
    d_ff: int = 0  # 0 = 4 * d_model
    tie_embeddings: bool = True
    layer_norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"model {self.name}: d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.d_ff == 0:
            object.__setattr__(self, "d_ff", 4 * self.d_model)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    # ------------------------------------------------------------------ sizes
    def block_params(self) -> int:
        d, f = self.d_model, self.d_ff
        attn = d * 3 * d + 3 * d + d * d + d  # qkv + proj, with biases
        mlp = d * f + f + f * d + d
        norms = 2 * 2 * d
        return attn + mlp + norms

    def embedding_params(self) -> int:
        return self.vocab_size * self.d_model + self.seq_len * self.d_model

    def head_params(self) -> int:
        """Final LayerNorm plus the vocabulary head (0 extra weights when tied)."""
        return 2 * self.d_model + (0 if self.tie_embeddings else self.vocab_size * self.d_model)

    def num_params(self) -> int:
        return self.embedding_params() + self.n_layers * self.block_params() + self.head_params()

    # ------------------------------------------------------------------ cost model
    def block_flops_per_token(self) -> float:
        """Training FLOPs (forward + backward = 3x forward) of one block for one token.

        Matmul weights cost 2 FLOPs per weight forward; attention scores and the weighted sum cost
        2 * 2 * seq_len * d_model forward (full, not causal-halved: the Megatron/PaLM convention for MFU).
        """
        d, f, t = self.d_model, self.d_ff, self.seq_len
        matmul = 4 * d * d + 2 * d * f
        return 3 * (2 * matmul + 4 * t * d)

    def head_flops_per_token(self) -> float:
        return 3 * 2 * self.d_model * self.vocab_size

    def flops_per_token(self) -> float:
        """6N + 12 L d T with N the matmul weights (embedding lookups are free): the number MFU uses."""
        return self.n_layers * self.block_flops_per_token() + self.head_flops_per_token()


MODEL_SIZES = {
    # CI: seconds on one CPU core. seq_len/vocab are normally overridden from the manifest.
    "tiny": ModelConfig("tiny", n_layers=2, d_model=64, n_heads=4, vocab_size=8192, seq_len=128),
    "125M": ModelConfig("125M", n_layers=12, d_model=768, n_heads=12, vocab_size=50304, seq_len=2048),
    "1.3B": ModelConfig("1.3B", n_layers=24, d_model=2048, n_heads=16, vocab_size=50304, seq_len=2048),
    "6.7B": ModelConfig("6.7B", n_layers=32, d_model=4096, n_heads=32, vocab_size=50304, seq_len=2048),
}


def model_config(name: str, **overrides) -> ModelConfig:
    if name not in MODEL_SIZES:
        raise ValueError(f"unknown model size {name!r}; choose one of {sorted(MODEL_SIZES)} (--model)")
    return MODEL_SIZES[name].replace(**overrides)


@dataclass
class DataConfig:
    path: str = "out/sample"  # a dataset directory holding manifest.json
    split: str = "train"
    seed: int = 0
    shuffle_buffer: int = 256  # examples per logical stream
    streams: int = 8  # logical data streams; the data-parallel size must divide it (elastic resume unit)
    verify_crc: bool = True


@dataclass
class ParallelConfig:
    dp: int = 1
    pp: int = 1
    microbatches: int = 1  # per data-parallel rank and step; >= pp when pp > 1
    schedule: str = "1f1b"  # gpipe | 1f1b
    partition: str = "flops"  # flops | profile | even (layer count; for comparison only)
    zero: bool = False  # ZeRO-1: shard the optimizer state over the data-parallel group


@dataclass
class OptimConfig:
    lr: float = 3e-3
    weight_decay: float = 0.1
    betas: tuple = (0.9, 0.95)
    warmup_steps: int = 10
    grad_clip: float = 1.0
    scale_lr_by_dp: bool = False  # lr * dp (linear scaling rule)


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    global_batch: int = 8  # examples per optimizer step, over all data-parallel ranks
    steps: int = 40
    seed: int = 0
    log_every: int = 5
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 0  # 0 = only at the end
    keep_checkpoints: int = 2
    resume: bool = True  # resume from checkpoint_dir/latest when it exists
    metrics_file: Optional[str] = None
    bf16: bool = True  # autocast on GPU only; CPU runs fp32
    max_seconds: float = 0.0  # stop after this much training time (benchmarks); 0 = no limit
    device: str = "auto"  # auto | cpu | cuda
    compile: bool = False  # torch.compile (pp = 1)
    stop_at_step: int = 0  # checkpoint and exit here; the LR schedule still spans `steps`
    dump_grads: Optional[str] = None  # tests: directory for each rank's first-step gradients

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
