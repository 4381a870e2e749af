"""Typed configuration for the trainer: one dataclass per component, named model sizes, cost model.

Everything the trainer does flows from a `TrainConfig`; no module-level state changes behaviour. The command
line is derived from these dataclasses (trainer/args.py `build_parser`: one option per field, choices from
`Literal`, help from the field), and `resolve_layout` applies the batch rules at parse time. Model sizes follow GPT-3 (Brown et al. 2020, table 2.1), with the vocabulary padded
to a multiple of 64 for tensor-core friendly head matmuls.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal, Optional


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


class ConfigError(ValueError):
    """A configuration that cannot run: the CLI prints its one line and exits 2 (before any process starts work)."""


def opt(default, help: str, *, flag: Optional[str] = None, cli: bool = True, **extra):
    """A config field that is also a command-line option (`flag` defaults to --field-name)."""
    factory = {"default_factory": default} if callable(default) and not isinstance(default, type) else {"default": default}
    return field(**factory, metadata={"help": help, "flag": flag, "cli": cli, **extra})


@dataclass
class ModelArgs:
    """The model as the user names it: a preset plus overrides. seq_len and vocab_size default to the data's."""
    preset: Literal["tiny", "125M", "1.3B", "6.7B"] = opt("tiny", "model size preset", flag="--model")
    seq_len: Optional[int] = opt(None, "default: the dataset contract's seq_len (a mismatch is refused)")
    vocab_size: Optional[int] = opt(None, "default: the dataset tokenizer's vocabulary, rounded up to a "
                                          "multiple of 64")
    n_layers: Optional[int] = opt(None, "override the preset's layer count")
    d_model: Optional[int] = opt(None, "override the preset's width")
    n_heads: Optional[int] = opt(None, "override the preset's head count")
    untied: bool = opt(False, "separate input embedding and output head")


@dataclass
class DataConfig:
    path: str = opt("out/sample", "dataset directory with manifest.json", flag="--data")
    split: str = opt("train", "split to train on")
    seed: int = opt(0, "data order seed (set from --seed)", cli=False)
    shuffle_buffer: int = opt(256, "examples per logical stream's shuffle buffer")
    streams: int = opt(0, "logical data streams (0 = 512, fewer on a small dataset); fixed for the run "
                          "and stored in checkpoints: a resume takes the checkpoint's", flag="--data-streams")
    verify_crc: bool = opt(True, "check every record's CRCs", cli=False)
    verify_data: bool = opt(False, "check every shard's sha256 against the manifest before training (hashed "
                                   "once per shard per node, split over the node's ranks)")
    tokenizer: Optional[str] = opt(None, "pin the tokenizer: its file (.model, .tiktoken, tokenizer.json or its "
                                         "directory) or its sha256; "
                                         "refused when the data was tokenized with another")
    index_dir: Optional[str] = opt(None, "where shard record offsets are cached (default: "
                                         "<checkpoint-dir>/offsets, else a per-user temp directory)")
    prefetch: int = opt(2, "batches prepared ahead by the loader thread (0 = none)")


@dataclass
class ParallelConfig:
    dp: Optional[int] = opt(None, "data-parallel size (default: world size / pp)")
    pp: int = opt(1, "pipeline stages")
    microbatches: int = opt(0, "micro-batches per rank and step (0 = derived: >= 4 x pp when pp > 1)")
    microbatch_size: int = opt(0, "sequences per micro-batch (0 = derived from --microbatches)")
    schedule: Literal["gpipe", "1f1b", "interleaved-1f1b"] = opt("1f1b", "pipeline schedule")
    partition: Literal["flops", "profile", "even"] = opt("flops", "how layers are split over stages")
    zero: bool = opt(False, "ZeRO-1: shard optimizer state over data parallel")
    tp: int = opt(1, "tensor-parallel size (within a node; divides n_heads and d_ff)")
    fsdp: bool = opt(False, "FSDP2: shard parameters, gradients and optimizer state over dp (bf16 compute, "
                            "fp32 reduction on GPU)")
    ac: Literal["none", "selective", "full"] = opt("none", "activation checkpointing of every block")
    virtual_stages: int = opt(1, "pipeline stages per rank (interleaved-1f1b: >= 2)")
    grad_reduce: Literal["auto", "ddp", "hooks", "after-backward"] = opt(
        "auto", "how gradients are averaged over dp: auto = DDP for plain data parallelism, hooks (each bucket's "
                "all-reduce starts during the last micro-batch's backward) with --pp/--tp, FSDP2's own "
                "reduce-scatter with --fsdp; after-backward = one bucketed all-reduce after the whole backward "
                "(no overlap)")
    grad_bucket_mb: float = opt(25.0, "gradient all-reduce bucket size in MiB (--grad-reduce hooks / after-backward)")
    timeout_minutes: float = opt(60.0, "process-group timeout for every collective (NCCL's default of 10 "
                                       "minutes can expire while the first steps index Pile-scale shards)")


@dataclass
class OptimConfig:
    lr: float = opt(3e-3, "peak learning rate (for the global batch: independent of the layout)")
    weight_decay: float = opt(0.1, "AdamW weight decay")
    betas: tuple[float, float] = opt((0.9, 0.95), "AdamW betas", cli=False)
    warmup_steps: int = opt(10, "linear warm-up steps")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0 = off)")
    adamw: Literal["auto", "fused", "foreach"] = opt("auto", "AdamW kernel: fused (one kernel per parameter "
                                                             "group), foreach, or auto (fused on CUDA, foreach "
                                                             "on CPU)")


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)  # resolved from ModelArgs and the data contract
    data: DataConfig = field(default_factory=DataConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    global_batch: int = opt(8, "sequences per optimizer step over all ranks: the recipe, never derived from "
                               "the cluster size")
    steps: int = opt(40, "optimizer steps")
    seed: int = opt(0, "model init and data order seed")
    log_every: int = opt(5, "log metrics every N steps")
    checkpoint_dir: Optional[str] = opt(None, "checkpoints (on shared storage for multi-node runs)")
    checkpoint_every: int = opt(0, "checkpoint every N steps (0 = only at the end)")
    keep_checkpoints: int = opt(2, "complete checkpoints kept")
    resume: bool = opt(True, "start fresh, ignoring checkpoint-dir/latest (without this flag a run resumes from "
                             "checkpoint-dir/latest when it exists)", flag="--no-resume")
    metrics_file: Optional[str] = opt(None, "append metrics as JSON lines here")
    bf16: bool = opt(True, "compute in fp32 on GPU too (without this flag GPU runs use bf16 autocast and FSDP2 "
                           "bf16 parameters; CPU runs are always fp32)", flag="--no-bf16")
    max_seconds: float = opt(0.0, "stop after this much training time (benchmarks); 0 = no limit")
    device: Literal["auto", "cpu", "cuda"] = opt("auto", "device")
    compile: bool = opt(False, "torch.compile every block (GPU runs; works with pp and --ac)")
    attention: Literal["auto", "sdpa", "flex", "varlen"] = opt("auto", "attention kernel for the document mask "
                                                                "(auto: flex on CUDA, dense-mask SDPA on CPU)")
    loss: Literal["chunked", "logits"] = opt("chunked", "chunked: cross-entropy over token chunks, never the "
                                                         "[B,T,V] fp32 logits; logits: the plain path")
    gpu: Optional[str] = opt(None, "GPU model for the memory plan that --check-only prints and every start "
                                   "enforces (A100-40GB, A100-80GB, H100, H200; default: the local device)")
    stop_at_step: int = opt(0, "checkpoint and exit at this step (e.g. a job time limit); the LR schedule still "
                               "runs to --steps, so a resumed run continues exactly")
    threads: int = opt(0, "torch intra-op threads per process (0 = default)")
    retro_sidecar: Optional[str] = opt(None, "RETRO: a neighbours sidecar (`pileprep retrieval neighbours`) of this "
                                             "shard generation; chunk length and k come from its contract")
    retro_layers: str = opt("1", "RETRO: comma-separated layer indices that get chunked cross-attention")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.parallel.dp

    @property
    def microbatch_size(self) -> int:
        return self.local_batch // self.parallel.microbatches


# ---------------------------------------------------------------------------------------------- batch rules
DEFAULT_STREAMS = 512


def default_microbatches(local_batch: int, pp: int) -> int:
    """The fewest micro-batches >= 4 x pp that divide the per-rank batch (bubble (p-1)/(m+p-1) <= 20%), else the
    most that do; 1 without a pipeline."""
    if pp == 1:
        return 1
    divisors = [m for m in range(1, local_batch + 1) if local_batch % m == 0]
    enough = [m for m in divisors if m >= 4 * pp]
    return enough[0] if enough else divisors[-1]


GRAD_REDUCE = ("auto", "ddp", "hooks", "after-backward")


def resolve_grad_reduce(mode: str, *, pp: int, tp: int, fsdp: bool) -> str:
    """The gradient-reduction mode a layout runs (trainer/grad_sync.py): fsdp / ddp / hooks / after-backward.
    Raises ValueError naming --grad-reduce for a combination that cannot run."""
    if mode not in GRAD_REDUCE:
        raise ValueError(f"unknown --grad-reduce {mode!r}; choose one of {', '.join(GRAD_REDUCE)}")
    if fsdp:
        if mode != "auto":
            raise ValueError(f"--grad-reduce {mode} does not apply with --fsdp (FSDP2 reduce-scatters gradients in "
                             f"its own backward hooks): drop --grad-reduce")
        return "fsdp"
    plain = pp == 1 and tp == 1
    if mode == "auto":
        return "ddp" if plain else "hooks"
    if mode == "ddp" and not plain:
        raise ValueError("--grad-reduce ddp needs --pp 1 and --tp 1 (DDP takes neither pipeline stages with several "
                         "micro-batches in flight nor DTensor parameters): use hooks or after-backward")
    return mode


def resolve_layout(cfg: TrainConfig, world: int) -> TrainConfig:
    """Apply the batch rules (trainer/README.md "Batch rules") for `world` processes; fill dp and micro-batches
    in place.

    The global batch is the user's recipe; the layout only decides how it is cut: dp ranks get global_batch / dp
    sequences each, split into micro-batches (count x size = per-rank batch). Raises ConfigError naming the fix.
    """
    p = cfg.parallel
    if p.tp < 1 or (p.tp > 1 and (cfg.model.n_heads % p.tp or cfg.model.d_ff % p.tp)):
        raise ConfigError(f"--tp {p.tp} must divide n_heads {cfg.model.n_heads} and d_ff {cfg.model.d_ff}")
    if p.pp < 1 or world % (p.pp * p.tp):
        raise ConfigError(f"{world} processes do not split into pipelines of --pp {p.pp} stages x --tp {p.tp}")
    dp = p.dp or world // (p.pp * p.tp)
    if dp * p.pp * p.tp != world:
        raise ConfigError(f"torchrun started {world} processes but --dp {dp} x --pp {p.pp} x --tp {p.tp} = "
                          f"{dp * p.pp * p.tp}: make them agree (--nproc-per-node x nodes = dp x pp x tp)")
    if p.schedule == "interleaved-1f1b" and (p.virtual_stages < 2 or p.pp < 2):
        raise ConfigError("--schedule interleaved-1f1b needs --pp >= 2 and --virtual-stages >= 2")
    if p.virtual_stages != 1 and p.schedule != "interleaved-1f1b":
        raise ConfigError(f"--virtual-stages {p.virtual_stages} needs --schedule interleaved-1f1b")
    if p.fsdp and (p.zero or p.virtual_stages > 1):
        raise ConfigError("--fsdp already shards the optimizer state (drop --zero) and does not take "
                          "--virtual-stages yet")
    if p.zero and p.tp > 1:
        raise ConfigError("--zero shards plain parameters only: with --tp drop --zero (or use --fsdp)")
    try:
        resolve_grad_reduce(p.grad_reduce, pp=p.pp, tp=p.tp, fsdp=p.fsdp)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not p.grad_bucket_mb > 0:
        raise ConfigError(f"--grad-bucket-mb {p.grad_bucket_mb} must be > 0")
    if cfg.global_batch < 1 or cfg.global_batch % dp:
        raise ConfigError(f"--global-batch {cfg.global_batch} does not split over dp = {dp} ranks: use a multiple "
                          f"of {dp}")
    local = cfg.global_batch // dp
    m = p.microbatches
    if p.microbatch_size:
        if local % p.microbatch_size:
            raise ConfigError(f"per-rank batch {local} (--global-batch {cfg.global_batch} / dp {dp}) is not a "
                              f"multiple of --microbatch-size {p.microbatch_size}")
        if m and m * p.microbatch_size != local:
            raise ConfigError(f"--microbatches {m} x --microbatch-size {p.microbatch_size} != per-rank batch "
                              f"{local}: give one of them")
        m = local // p.microbatch_size
    elif not m:
        m = default_microbatches(local, p.pp)
    if local % m:
        raise ConfigError(f"per-rank batch {local} (--global-batch {cfg.global_batch} / dp {dp}) does not split "
                          f"into {m} micro-batches (--microbatches)")
    if p.pp > 1 and m < p.pp:
        raise ConfigError(f"--microbatches {m} < pipeline stages {p.pp}: the pipeline would never fill; use at "
                          f"least {p.pp} (more shrinks the bubble (p-1)/(m+p-1)); per-rank batch is {local}")
    units = cfg.model.n_layers + 2
    if p.pp * p.virtual_stages > units:
        raise ConfigError(f"--pp {p.pp} x --virtual-stages {p.virtual_stages} exceeds the model's {units} pipeline "
                          f"units (embed, blocks, head)")
    if cfg.data.streams < 0 or cfg.data.shuffle_buffer < 1:
        raise ConfigError("--data-streams must be >= 0 and --shuffle-buffer >= 1")
    p.dp, p.microbatches, p.microbatch_size = dp, m, local // m
    return cfg


def resolve_model(args: ModelArgs, contract=None) -> ModelConfig:
    """The model config: preset, then the data contract's seq_len / vocabulary, then explicit flags."""
    seq_len, vocab = args.seq_len, args.vocab_size
    if contract is not None:
        seq_len = seq_len or contract.seq_len
        vocab = vocab or -(-contract.tokenizer.vocab_size // 64) * 64
    return model_config(args.preset, seq_len=seq_len, vocab_size=vocab, n_layers=args.n_layers,
                        d_model=args.d_model, n_heads=args.n_heads, tie_embeddings=False if args.untied else None)
