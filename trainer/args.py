"""The trainer's command line: its options (derived from trainer/config.py's dataclasses), and the whole
configuration resolved and checked before any process-group work (the model from the data contract, the batch
rules, the memory plan against the GPU or the host, the checkpoint directory, the RETRO sidecar), so that a bad
configuration is one clear error (exit 2), not a hang.
`python -m trainer.train` (trainer/train.py) runs it first; launchers call `parse_args` to validate a layout.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from typing import TYPE_CHECKING, Literal, Optional, Sequence

from model_contract import MANIFEST_NAME
from trainer import checkpoint as ckpt
from trainer.config import (ConfigError, DataConfig, ModelArgs, OptimConfig, ParallelConfig, TrainConfig,
                            resolve_layout, resolve_model)
from trainer.dataset import open_dataset, read_manifest
from trainer.plan import LayoutDoesNotFit, plan_for_config

if TYPE_CHECKING:
    from trainer.retro import RetroSpec

# trainer/train.py's first docstring line: `--help` shows the command it belongs to
DESCRIPTION = 'Entry point: `torchrun --nproc-per-node N -m trainer.train --data out/sample --pp 2 ...`.'


def _fields(cls):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("cli"):
            yield f, hints[f.name]


def help_with_default(text: str, is_flag: bool, default=None) -> str:
    """The help text with its default: a flag is off unless given (its text says what it does); a value shows
    its default, unless the text already explains a computed one ("default: the dataset's ...")."""
    text = text.replace("%", "%%")  # argparse %-formats help strings
    if is_flag:
        return f"{text} (default: off)"
    if default is None and "default" in text:
        return text
    shown = "none" if default is None else str(default).replace("%", "%%")
    return f"{text} (default: {shown})"


def add_arguments(parser: argparse.ArgumentParser, cls, prefix: str) -> None:
    """One option per CLI field of `cls`, its type, default, choices (Literal) and help from the dataclass."""
    for f, tp in _fields(cls):
        flag = f.metadata["flag"] or "--" + f.name.replace("_", "-")
        dest = f"{prefix}{f.name}"
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if tp is bool:
            inverted = flag.startswith("--no-")
            parser.add_argument(flag, dest=dest, action="store_false" if inverted else "store_true",
                                default=default, help=help_with_default(f.metadata["help"], True))
            continue
        args = typing.get_args(tp)
        if typing.get_origin(tp) is typing.Union:  # Optional[X]
            tp = next(a for a in args if a is not type(None))
            args = typing.get_args(tp)
        kw = {}
        if typing.get_origin(tp) is Literal:
            kw["choices"] = list(args)
            tp = type(args[0])
        parser.add_argument(flag, dest=dest, type=tp, default=default,
                            help=help_with_default(f.metadata["help"], False, default), **kw)


def build_parser(prog: str = "trainer.train", description: str = "") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description, allow_abbrev=False)
    for cls, prefix in ((ModelArgs, "model."), (DataConfig, "data."), (ParallelConfig, "parallel."),
                        (OptimConfig, "optim."), (TrainConfig, "")):
        add_arguments(p, cls, prefix)
    return p


def from_namespace(ns: argparse.Namespace) -> tuple[ModelArgs, TrainConfig]:
    vals = vars(ns)

    def build(cls, prefix):
        return cls(**{f.name: vals[prefix + f.name] for f, _ in _fields(cls)})

    model_args = build(ModelArgs, "model.")
    cfg = TrainConfig(data=build(DataConfig, "data."), parallel=build(ParallelConfig, "parallel."),
                      optim=build(OptimConfig, "optim."),
                      **{f.name: vals[f.name] for f, _ in _fields(TrainConfig)})
    cfg.data.seed = cfg.seed
    return model_args, cfg



def _parser():
    p = build_parser(description=DESCRIPTION)
    p.add_argument("--check-only", action="store_true",
                   help="validate the configuration for WORLD_SIZE processes (layout, batch rules, data contract "
                        "when the data is reachable), print the resolved layout and exit; launchers run it first "
                        "(default: off)")
    return p


def resumed_generation(cfg: TrainConfig) -> Optional[str]:
    """The generation the checkpoint a resume starts from was trained on (None: a fresh run, or a checkpoint
    written before checkpoints recorded it)."""
    latest = ckpt.latest_checkpoint(cfg.checkpoint_dir) if cfg.resume else None
    return ckpt.read_meta(latest).get("generation") if latest else None


def parse_args(argv: Optional[Sequence[str]] = None, world: Optional[int] = None) -> TrainConfig:
    """The full, validated config: every batch rule, and the data contract when the dataset is reachable from
    here, checked now (ConfigError / ContractMismatchError) — not after the processes have met."""
    ns = _parser().parse_args(argv)
    model_args, cfg = from_namespace(ns)
    check_checkpoint_dir(cfg.checkpoint_dir)
    contract, generation = None, None
    if os.path.exists(cfg.data.path):
        generation = resumed_generation(cfg)  # a resume sizes the model from its own generation's contract
        contract = read_manifest(cfg.data, generation)[0].contract
    cfg.model = resolve_model(model_args, contract)
    world = world if world is not None else int(os.environ.get("WORLD_SIZE", "1"))
    auto_micro_batch = not (cfg.parallel.microbatches or cfg.parallel.microbatch_size)
    resolve_layout(cfg, world)
    if contract is not None:
        manifest = open_dataset(cfg.data, cfg.model, generation)[0]
        if cfg.retro_sidecar:
            retro_config(cfg, manifest)
    cfg.check_only = ns.check_only  # an action of this CLI, not part of the training config
    try:  # the memory plan: a layout over the GPU's memory is refused here (exit 2)
        cfg.plan = plan_for_config(cfg, choose_micro_batch_size=auto_micro_batch)
    except LayoutDoesNotFit as e:
        raise ConfigError(str(e)) from None
    if not cfg.plan.fits:
        raise ConfigError(f"memory plan: {cfg.plan.total / 2**30:.1f} GiB per GPU does not fit the {cfg.plan.gpu}'s "
                          f"{cfg.plan.capacity / 2**30:.1f} GiB (python -m trainer.plan shows the parts): shard more "
                          f"(--fsdp, --tp, --pp), checkpoint activations (--ac) or lower --microbatch-size")
    check_host_memory(cfg)
    return cfg


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_host_memory(cfg: TrainConfig) -> None:
    """On CPU the plan has no GPU to fit, but the model still has to fit the host: a contract whose vocab_size
    or seq_len is within trainer/dataset.py's limits can still size a model (embedding, head, AdamW state) beyond
    the machine's memory, which torch would report as an allocation traceback. Refused here, in one line, from
    the same plan (trainer/plan.py), before any process allocates."""
    if cfg.device != "cpu" or cfg.gpu:  # a GPU plan has its own fit check above; `auto` may plan for GPU nodes
        return                          # from a launcher host that has none (trainer/launch/)
    local_procs = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    need, have = cfg.plan.total * local_procs, host_memory_bytes()
    if need > have:
        raise ConfigError(f"memory plan: {need / 2**30:.1f} GiB for {local_procs} process(es) of model "
                          f"{cfg.model.name} (vocab {cfg.model.vocab_size}, seq_len {cfg.model.seq_len}, from the "
                          f"dataset's contract) exceeds this host's {have / 2**30:.1f} GiB; check the dataset's "
                          f"manifest or choose a smaller --model")


def describe_layout(cfg: TrainConfig) -> str:
    p = cfg.parallel
    return (f"model {cfg.model.name} ({cfg.model.num_params() / 1e6:.0f}M params, seq_len {cfg.model.seq_len}, "
            f"vocab {cfg.model.vocab_size}); global batch {cfg.global_batch} = dp {p.dp} x {p.microbatches} "
            f"micro-batches x {p.microbatch_size} sequences; pp {p.pp} ({p.schedule}); tp {p.tp}; "
            f"fsdp {p.fsdp}; activation checkpointing {p.ac}")


def retro_config(cfg: TrainConfig, manifest) -> Optional[RetroSpec]:
    """The RETRO stage options from --retro-sidecar/--retro-layers, the sidecar checked against this shard
    generation (ContractMismatchError naming it, exit 2) — before any process-group work."""
    if not cfg.retro_sidecar:
        return None
    from trainer.retro import RetroSpec, open_sidecar, parse_layers  # noqa: PLC0415
    try:
        layers = parse_layers(cfg.retro_layers, cfg.model.n_layers)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    _, spec = open_sidecar(cfg.retro_sidecar, manifest, cfg.model.seq_len)
    return RetroSpec(layers=layers, chunk_len=spec.chunk_len, neighbour_len=spec.neighbour_len,
                     pad_id=manifest.contract.tokenizer.pad_id)


# ---------------------------------------------------------------------------------------------- training
def check_checkpoint_dir(checkpoint_dir: Optional[str]) -> None:
    """ConfigError (exit 2) when --checkpoint-dir holds a pileprep output (its manifest.json): checkpoints,
    `latest` and the offsets cache written among a dataset's, a chunk database's or a sidecar's files, the rule
    every pipeline command keeps (pipeline/ops/commit.py `check_output_kind`)."""
    if checkpoint_dir and os.path.isfile(os.path.join(checkpoint_dir, MANIFEST_NAME)):
        raise ConfigError(f"--checkpoint-dir {checkpoint_dir}: it holds a pileprep output (manifest.json); "
                          f"checkpoints are never written into a dataset, database or sidecar: choose another "
                          f"--checkpoint-dir")
