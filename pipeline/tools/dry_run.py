"""`pileprep shard --dry-run`: what a run would make, estimated from a sample of the inputs; writes nothing.

The driver's own planning (`shard_pipeline.prepare`: config validation, input listing, tokenizer, committed
manifest for `--incremental`) runs as in a real run, so every configuration error a real run would report
before starting is reported here too. Then three parts, one module each:
- the stage model (pipeline/tools/dry_run_sample.py): a few input files spread over the listing read through the
  job's reader and parser, up to a byte budget each, tokenized with the real tokenizer and split with the job's
  own split function, examples packed and framed as the shard stage does, each stage's CPU measured;
- the calibration (pipeline/tools/dry_run_calibration.py): the job itself run on a slice of that sample, for what
  it spends around the modelled stages;
- the estimate (this module): the sample scaled up to the whole input, per source and per split; shard counts
  from the job's own shard planner (with `--source-weights` applied to each source's estimated train tokens, as
  the job sizes its shards), output bytes from the framed examples. Core-hours are the CPU time the sample took
  per stage: read+parse per input byte, tokenize per text byte *of each source* (each source's own measured rate
  scaled by that source's estimated bytes), pack+encode per example, plus the calibration's extra CPU per raw
  byte and per run. Start-up (the interpreter and imports, as the CLI's own process spent them before
  estimating, the driver's planning as a real run does it, and the one-record run's CPU: graph, runner, commit)
  is the same for any input; it is included in core-hours once and shown apart, so the estimate compares with a
  real run's whole process tree (its share of a small run: docs/BENCHMARKS.md, "Dry run calibration"). A
  machine-dependent estimate, not a promise. Wall time on N workers (`--dry-run-workers`) is the driver's
  measured planning time plus core-hours / N, i.e. perfect scaling: a lower bound.

Not modelled: exact duplicates (removed by the job), and compression ratios that change inside a file beyond
the sampled prefix.
"""
from __future__ import annotations

import math
import os
import time
import types
from dataclasses import dataclass, field
from typing import Optional

from pipeline.config import ShardConfig
from pipeline.tools.dry_run_calibration import CALIBRATION_BYTES, Calibration, calibrate, process_cpu_s
from pipeline.tools.dry_run_packing import PackingEstimate, RecordingEncoder, estimate_packing, packing_rows
from pipeline.tools.dry_run_sample import (MAX_SAMPLE_FILES, SAMPLE_INPUT_BYTES_PER_FILE, output_bytes_per_example,
                                           pick_files, sample_inputs)
from transforms.shard.documents import HASHED, SPLITS


@dataclass
class Estimate:
    files: int
    input_bytes: int
    sampled_files: int
    sampled_input_bytes: int
    raw_bytes: int
    records: int
    documents: int
    dead_letters: int
    tokens: int
    tokens_per_split: dict[str, int]  # split name -> tokens
    examples: int
    shards: int
    shards_per_split: dict[str, int]  # split name -> shards
    output_bytes: int
    core_hours: float
    nothing_to_do: bool = False
    decision: str = ""  # the line the real run would print instead of building (pipeline/shard/plan.py decide)
    notes: list[str] = field(default_factory=list)
    workers: int = 1
    wall_s: float = 0.0  # driver planning + core-hours / workers (perfect scaling: a lower bound)
    startup_s: float = 0.0
    startup_core_s: float = 0.0  # included in core_hours: a run's CPU whatever its input (see the docstring)
    # source -> {documents, tokens, text_bytes: int; tokenize_core_s: float}
    sources: dict[str, dict[str, float]] = field(default_factory=dict)
    calibration: Optional[Calibration] = None
    packing: Optional[PackingEstimate] = None  # both packings on the sampled documents (dry_run_packing.py)
    concat_padding: float = 0.0  # concat's padding fraction from the estimated examples (each shard's last)


def default_workers(beam_args) -> int:
    """--direct_num_workers when given (the local runner's cores), else this machine's cores."""
    from pipeline.ops.runners import arg_value  # noqa: PLC0415

    value = arg_value(beam_args, "--direct_num_workers")
    return int(value) if value is not None and value.isdigit() and int(value) > 0 else os.cpu_count() or 1


def estimate(config: ShardConfig, beam_args=None, incremental_run: bool = False, sample_files: int = MAX_SAMPLE_FILES,
             budget_per_file: int = SAMPLE_INPUT_BYTES_PER_FILE, workers: int = None,
             calibrated: bool = True, process_startup_cpu_s: float = 0.0) -> Estimate:
    """The estimate (module docstring). `process_startup_cpu_s`: what the calling process spent before it (the
    CLI passes its own CPU so far, interpreter and imports: a real run's driver spends the same); added to the
    start-up with the calibration's one-record run."""
    from pipeline.beam_glue import pipeline_options  # noqa: PLC0415
    from pipeline.job import NothingToDo  # noqa: PLC0415
    from pipeline.shard import plan as shard_plan  # noqa: PLC0415
    from pipeline.shard import shard_pipeline  # noqa: PLC0415
    from pipeline.shard.manifest_builder import shard_write_tasks  # noqa: PLC0415
    from transforms.io.filesystem_options import set_filesystem_options  # noqa: PLC0415
    from transforms.tokenize import tokenizer  # noqa: PLC0415

    if workers is not None and workers < 1:
        from pipeline.errors import ConfigError  # noqa: PLC0415

        raise ConfigError(f"--dry-run-workers {workers}: must be at least 1")
    workers = workers or default_workers(beam_args)
    t_start = time.monotonic()
    cpu_0 = process_cpu_s()
    set_filesystem_options(pipeline_options(beam_args))
    plan = shard_pipeline.prepare(config, incremental_run)
    startup_s = time.monotonic() - t_start
    planning_cpu_s = process_cpu_s() - cpu_0  # a real run's driver plans the same way (imports, tokenizer, listing)
    rows = list(plan.input_rows)
    total_in = sum(r["bytes"] for r in rows)
    decision = shard_plan.decide(plan)  # the real run's one exit before any work: the dry run takes it too
    if isinstance(decision, NothingToDo) or not rows:
        return Estimate(0, 0, 0, 0, 0, 0, 0, 0, 0, {}, 0, 0, {}, 0, 0.0, nothing_to_do=True,
                        decision=getattr(decision, "message", "") or "nothing to do: no input files")
    sp = tokenizer.load_processor(plan.model_bytes, config.tokenizer, tokenizer.options_of(config))
    if plan.tokenizer_backend is not None:  # the encoder the job's workers would run, so its rate is theirs
        from transforms.tokenize import tokenizer_backends  # noqa: PLC0415

        sp = tokenizer_backends.make_encoder(plan.tokenizer_backend, plan.model_bytes, sp)
    sp = RecordingEncoder(sp)  # the sampled documents' lengths, for the packing estimate
    # --val-input / --test-input files go whole to their split: sampled and scaled as a group of their own, so a
    # small official val file is neither skipped by the file pick nor scaled by the train files' size.
    input_splits = dict(zip((e.path for e in plan.ledger), plan.input_splits))
    groups = ([r for r in rows if input_splits.get(r["path"], HASHED) == HASHED],
              [r for r in rows if input_splits.get(r["path"], HASHED) != HASHED])
    parts = []  # (picked rows, sample, scale)
    for group in groups:
        if group:
            picked = pick_files(group, sample_files)
            sample = sample_inputs(picked, config, sp, budget_per_file, input_splits=input_splits,
                                   slice_bytes=CALIBRATION_BYTES // len(groups) if calibrated else 0)
            scale = sum(r["bytes"] for r in group) / sample.input_bytes if sample.input_bytes else 0.0
            parts.append((picked, sample, scale))
    split_tokens = [0.0] * len(SPLITS)
    split_docs = [0.0] * len(SPLITS)
    raw_bytes = records = documents = dead_letters = core_s = 0.0
    sources: dict = {}
    for _picked, s, scale in parts:
        tokens_per_byte = s.tokenized_tokens / s.tokenized_text_bytes if s.tokenized_text_bytes else 0.0
        cpu_per_byte = s.tokenize_cpu_s / s.tokenized_text_bytes if s.tokenized_text_bytes else 0.0
        for name, src in s.by_source.items():  # each source at its own measured rates
            est = src.split_token_estimate(tokens_per_byte)
            row = sources.setdefault(name, {"documents": 0.0, "tokens": 0.0, "text_bytes": 0.0,
                                            "tokenize_core_s": 0.0, "split_tokens": [0.0] * len(SPLITS),
                                            "split_docs": [0.0] * len(SPLITS)})
            row["documents"] += src.documents * scale
            row["text_bytes"] += src.text_bytes * scale
            row["tokens"] += sum(est) * scale
            row["tokenize_core_s"] += src.cpu_per_byte(cpu_per_byte) * src.text_bytes * scale
            for i in range(len(SPLITS)):
                row["split_tokens"][i] += est[i] * scale
                row["split_docs"][i] += src.split_docs[i] * scale
        raw_bytes += s.raw_bytes * scale
        records += s.records * scale
        documents += s.documents * scale
        dead_letters += s.dead_letters * scale
        core_s += s.read_cpu_s * scale
    for row in sources.values():
        core_s += row["tokenize_core_s"]
        for i in range(len(SPLITS)):
            split_tokens[i] += row["split_tokens"][i]
            split_docs[i] += row["split_docs"][i]
    weights = config.mixture_weights
    if weights:  # the train split as written: each source's documents and tokens times its weight (epochs)
        split_tokens[0] = sum(weights.get(n, 1.0) * r["split_tokens"][0] for n, r in sources.items())
        split_docs[0] = sum(weights.get(n, 1.0) * r["split_docs"][0] for n, r in sources.items())
    # The job's own shard planner, given what its tokenize stage would report: per-split tokens and, for
    # --source-weights sizing, per-source token statistics (pipeline/shard/manifest_builder.py).
    unweighted_train = sum(r["split_tokens"][0] for r in sources.values())
    units = [types.SimpleNamespace(
        split_tokens=[int(round(unweighted_train if i == 0 else t)) for i, t in enumerate(split_tokens)],
        source_stats={n: {"tokens": int(round(r["split_tokens"][0]))} for n, r in sorted(sources.items())})]
    tasks = shard_write_tasks(units, config)
    shards_per_split = {SPLITS[i]: sum(1 for t in tasks if t.split == i) for i in range(len(SPLITS))}
    packed = estimate_packing(sp.lengths, config.seq_len, config.packing, config.packing_window)
    # best-fit: every window's examples carry the sampled padding; concat: only each shard's last example
    fill = 1.0 - packed.best_fit["padding_fraction"] if config.packing == "best-fit" else 1.0
    examples = concat_examples = 0.0
    for i in range(len(SPLITS)):
        n_shards = shards_per_split[SPLITS[i]]
        if n_shards:  # documents + one EOS each, packed per shard; the last example of a shard is padded
            concat_examples += (split_tokens[i] + split_docs[i]) / config.seq_len + n_shards / 2
            examples += (split_tokens[i] + split_docs[i]) / config.seq_len / max(fill, 1e-9) + n_shards / 2
    concat_slots = concat_examples * config.seq_len
    concat_padding = (concat_slots - sum(split_tokens) - sum(split_docs)) / concat_slots if concat_slots else 0.0
    contract = plan.contract.tokenizer
    bytes_per_example, encode_cpu = output_bytes_per_example(
        max((s for _p, s, _scale in parts), key=lambda s: len(s.token_arrays)), config.seq_len, contract.eos_id,
        contract.pad_id)
    tokens = int(round(sum(split_tokens)))
    core_s += encode_cpu * examples
    sampled_files = sum(len(picked) for picked, _s, _scale in parts)
    sampled_bytes = sum(s.input_bytes for _p, s, _scale in parts)
    notes = []
    if sampled_bytes < total_in:
        notes.append(f"sampled {sampled_bytes / total_in:.1%} of the input bytes")
    calibration = calibrate(config, [sl for _p, smp, _scale in parts for sl in smp.slices],
                            _model_core_s) if calibrated else None
    startup_core_s = 0.0
    if calibration is not None:
        startup_core_s = process_startup_cpu_s + planning_cpu_s + calibration.one_record_cpu_s
        core_s += calibration.extra_cpu_per_byte * raw_bytes + calibration.overhead_cpu_s + startup_core_s
        notes.append(f"core time calibrated by the job itself on {calibration.raw_bytes:,} raw bytes of the sample: "
                     f"the stage model plus {calibration.extra_cpu_per_byte * 1e9:,.1f} CPU-s per GB of raw JSON "
                     f"(x{calibration.factor:.2f} the model on that slice) and {calibration.overhead_cpu_s:,.1f} "
                     f"CPU-s per run")
    return Estimate(files=len(rows), input_bytes=total_in, sampled_files=sampled_files,
                    sampled_input_bytes=sampled_bytes, raw_bytes=int(raw_bytes),
                    records=int(round(records)), documents=int(round(documents)),
                    dead_letters=int(round(dead_letters)), tokens=tokens,
                    tokens_per_split={SPLITS[i]: int(round(t)) for i, t in enumerate(split_tokens)},
                    examples=int(math.ceil(examples)), shards=len(tasks), shards_per_split=shards_per_split,
                    output_bytes=int(examples * bytes_per_example), core_hours=core_s / 3600.0, notes=notes,
                    workers=workers, wall_s=startup_s + core_s / workers, startup_s=startup_s,
                    startup_core_s=startup_core_s,
                    sources={n: {"documents": int(round(r["documents"])), "tokens": int(round(r["tokens"])),
                                 "text_bytes": int(round(r["text_bytes"])),
                                 "tokenize_core_s": round(r["tokenize_core_s"], 3)}
                             for n, r in sorted(sources.items())}, calibration=calibration, packing=packed,
                    concat_padding=max(concat_padding, 0.0))


def _model_core_s(config: ShardConfig, beam_args, sample_files: int) -> float:
    """The stage model alone (uncalibrated) on every byte of `config`'s inputs, in core seconds: the calibration's
    yardstick for its slice (pipeline/tools/dry_run_calibration.py)."""
    model = estimate(config, beam_args, sample_files=sample_files, budget_per_file=1 << 62, workers=1,
                     calibrated=False)
    return model.core_hours * 3600.0


def format_estimate(e: Estimate) -> str:
    if e.nothing_to_do:
        return f"dry run: {e.decision}; nothing was written"
    rows = [
        ("input files", f"{e.files:,}", f"{e.sampled_files} sampled"),
        ("input bytes", f"{e.input_bytes:,}", f"{e.sampled_input_bytes:,} read"),
        ("raw JSON bytes", f"{e.raw_bytes:,}", "estimated"),
        ("records", f"{e.records:,}", "estimated"),
        ("documents", f"{e.documents:,}", f"dead letters ~{e.dead_letters:,}"),
        ("tokens", f"{e.tokens:,}", " / ".join(f"{k} {v:,}" for k, v in e.tokens_per_split.items())),
        ("examples", f"{e.examples:,}", "estimated"),
        ("shards", f"{e.shards:,}", " / ".join(f"{k} {v}" for k, v in e.shards_per_split.items())),
        ("output bytes", f"{e.output_bytes:,}", f"{e.output_bytes / 2**30:,.2f} GiB"),
        ("core-hours", f"{e.core_hours:,.3f}",
         f"{e.core_hours * 3600:,.1f} core-s: CPU time on this machine, scaled from the sample; "
         f"{e.startup_core_s:,.1f} core-s of it start-up, once per run"),
        (f"wall on {e.workers} workers", _duration(e.wall_s),
         f"planning {e.startup_s:,.1f}s + core-hours / {e.workers} (perfect scaling: a lower bound)"),
    ]
    if e.packing is not None:
        rows += packing_rows(e.packing, e.concat_padding)
    for name, r in e.sources.items():
        rows.append((f"  source {_safe(name)[:40]}", f"{r['tokens']:,}",
                     f"tokens; {r['documents']:,} documents, {r['tokenize_core_s'] / 3600:,.3f} core-hours tokenizing"))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = ["dry run (nothing written): estimates from a sample of the inputs"]
    lines += [f"  {r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]}" for r in rows]
    lines += [f"  note: {n}" for n in e.notes]
    if e.packing is not None and e.packing.packing == "best-fit" and e.packing.small_sample:
        lines.append(f"  note: the sample holds fewer tokens than one best-fit window ({e.packing.window_examples:,}"
                     f" examples): its padding is packed in a smaller window than the run's, so it is pessimistic")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:,.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds / 3600:,.1f} h"


def _safe(name: str) -> str:
    """A source name from the data as terminal text: control characters and escape sequences shown, not run."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in str(name))

