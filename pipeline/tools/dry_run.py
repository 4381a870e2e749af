"""`pileprep shard --dry-run`: what a run would make, estimated from a sample of the inputs; writes nothing.

The driver's own planning (`shard_pipeline.prepare`: config validation, input listing, tokenizer, committed
manifest for `--incremental`) runs as in a real run, so every configuration error a real run would report
before starting is reported here too. Then a few input files spread over the listing are read through the
job's reader and parser, up to a byte budget each: the ratio of raw JSON to input bytes and of documents and
text to raw bytes scale the sample up to the whole input. Documents are tokenized (up to a character budget;
beyond it tokens are scaled from bytes) with the real tokenizer and assigned to splits with the job's own
split function, shard counts come from the job's own shard planner (with `--source-weights` applied to each
source's estimated train tokens, as the job sizes its shards), and output bytes from packing and encoding
sampled examples exactly as the shard stage does. Core-hours are the CPU time the sample took per stage:
read+parse per input byte, tokenize per text byte *of each source* (code, prose and maths tokenize at
different rates, so each source's own measured rate is scaled by that source's estimated bytes), pack+encode
per example. Those stage timings miss what the job adds around them (document ids, statistics, spill writes,
hashing, the runner's per-element cost), so the dry run also runs the job itself, in this process, on a slice of
the sample (CALIBRATION_BYTES of raw lines from the sampled files, recompressed as they were) and on its half, and
adds to the stage model what the job's marginal CPU per byte between the two exceeds the model's on that same
slice, times the input's raw bytes (`Calibration`), and the CPU a run spends above a one-record run. Start-up
(the interpreter and imports, as the CLI's own process spent them before estimating, the driver's planning as
a real run does it, and the one-record run's CPU: graph, runner, commit) is the same for any input; it is included in core-hours once and shown
apart, so the estimate compares with a real run's whole process tree (nothing at Pile scale, a third of a
96 MB run). A machine-dependent estimate, not a promise. Wall time on N workers (`--dry-run-workers`) is the driver's measured planning time plus
core-hours / N, i.e. perfect scaling: a lower bound.

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

import numpy as np

from model_contract import frame_examples
from pipeline.config import ShardConfig
from transforms.io import io_utils
from transforms.shard.documents import HASHED, SPLITS, Document, assign_split, parse_record
from transforms.shard.packing import BLOCK_EXAMPLES, pack_blocks
from transforms.io.read_records import FileDamage, compression_of, iter_raw_records

MAX_SAMPLE_FILES = 16
SAMPLE_INPUT_BYTES_PER_FILE = 16 << 20  # compressed bytes read per sampled file, at most
TOKENIZE_CHARS = 8_000_000  # characters tokenized in all; further documents' tokens are scaled from bytes
ENCODE_EXAMPLES = 256  # examples packed and encoded to measure output bytes per example
# Raw JSON lines (in all) the job itself runs on to calibrate the stage model. The job's marginal CPU per byte is
# the difference of two runs (the slice and its half) that each carry ~0.5 CPU-s of fixed cost, so the slice must
# be large beside that. With the machine at load 5-10 on 2 cores the job/model ratio on the slice came out
# 1.32-2.00 at 4 MB and 1.06-2.06 at 16 MB with the best of two runs per size (bench/dry_run_bench.py and
# experiments beside it): still noisy, so the estimate adds the difference rather than multiplying by the ratio
# (`Calibration.extra_cpu_per_byte`). 16 MB costs a dry run ~3 CPU-s more than 4 MB with a fast tokenizer.
CALIBRATION_BYTES = 16 << 20
CALIBRATION_REPEATS = 3  # runs of the slice and of its half; each size's least CPU counts (load only adds; with 2, one full-suite run under load measured the marginal rate at 0.07x the model)


class _CountingReader:
    """Counts the bytes the decompressor has pulled from the file (the compressed bytes consumed). Reads are
    capped at STEP bytes (short reads are legal for a raw stream), so that a sample that stops in the middle of
    a file knows how far it got to within STEP, not within the reader's 1 MiB blocks."""

    STEP = 16 << 10

    def __init__(self, raw):
        self.raw = raw
        self.count = 0

    def read(self, n=-1):
        data = self.raw.read(self.STEP if n is None or n < 0 else min(n, self.STEP))
        self.count += len(data)
        return data

    def readinto(self, buf):
        view = memoryview(buf)[:self.STEP]
        n = self.raw.readinto(view)
        self.count += n or 0
        return n

    def __getattr__(self, name):
        return getattr(self.raw, name)


@dataclass
class Sample:
    input_bytes: int = 0  # compressed bytes consumed
    raw_bytes: int = 0  # JSON lines (decompressed)
    records: int = 0
    documents: int = 0
    text_bytes: int = 0
    tokenized_text_bytes: int = 0
    tokenized_tokens: int = 0
    split_text_bytes: list = field(default_factory=lambda: [0] * len(SPLITS))
    split_tokens: list = field(default_factory=lambda: [0.0] * len(SPLITS))  # tokenized docs exact, others scaled
    split_docs: list = field(default_factory=lambda: [0] * len(SPLITS))
    untokenized_split_bytes: list = field(default_factory=lambda: [0] * len(SPLITS))
    dead_letters: int = 0
    filtered: int = 0
    read_cpu_s: float = 0.0
    tokenize_cpu_s: float = 0.0
    token_arrays: list = field(default_factory=list)  # a few documents' tokens, for the output bytes estimate
    by_source: dict = field(default_factory=dict)  # source -> SourceSample
    slices: list = field(default_factory=list)  # (input path, [raw lines]): the calibration run's input


@dataclass
class SourceSample:
    """One source's share of a sample: its own tokenize rate (CPU s and tokens per text byte)."""
    documents: int = 0
    text_bytes: int = 0
    tokenized_text_bytes: int = 0
    tokenized_tokens: int = 0
    tokenize_cpu_s: float = 0.0
    split_docs: list = field(default_factory=lambda: [0] * len(SPLITS))
    split_tokens: list = field(default_factory=lambda: [0] * len(SPLITS))  # of the tokenized documents
    untokenized_split_bytes: list = field(default_factory=lambda: [0] * len(SPLITS))

    def tokens_per_byte(self, fallback: float) -> float:
        return self.tokenized_tokens / self.tokenized_text_bytes if self.tokenized_text_bytes else fallback

    def cpu_per_byte(self, fallback: float) -> float:
        return self.tokenize_cpu_s / self.tokenized_text_bytes if self.tokenized_text_bytes else fallback

    def split_token_estimate(self, fallback_rate: float) -> list:
        rate = self.tokens_per_byte(fallback_rate)
        return [self.split_tokens[i] + self.untokenized_split_bytes[i] * rate for i in range(len(SPLITS))]


def pick_files(rows: list, n: int = MAX_SAMPLE_FILES) -> list:
    """Up to n rows spread evenly over the (sorted) listing, always including the first and the last."""
    if len(rows) <= n:
        return list(rows)
    idx = sorted({round(i * (len(rows) - 1) / (n - 1)) for i in range(n)})
    return [rows[i] for i in idx]


def sample_inputs(rows: list, config: ShardConfig, sp, budget_per_file: int = SAMPLE_INPUT_BYTES_PER_FILE,
                  tokenize_chars: int = TOKENIZE_CHARS, input_splits: dict = None,
                  slice_bytes: int = 0) -> Sample:
    """`input_splits`: path -> the split a --val-input / --test-input file goes to whole (HASHED otherwise).
    `slice_bytes`: raw lines kept (in all, spread over the files) for the calibration run."""
    s = Sample()
    chars_left = tokenize_chars
    per_file_chars = max(1, tokenize_chars // max(1, len(rows)))
    per_file_slice = slice_bytes // max(1, len(rows))
    for row in rows:
        file_chars = min(per_file_chars, chars_left)
        lines, slice_left = [], per_file_slice
        t0 = time.process_time()
        with io_utils.open_read(row["path"]) as raw:
            stream = _CountingReader(raw)
            for item in iter_raw_records(stream, compression_of(row["path"]), config.max_line_bytes,
                                         config.max_zstd_window_bytes):
                if isinstance(item, FileDamage):
                    s.records += 1
                    s.dead_letters += 1
                    continue
                s.records += 1
                s.raw_bytes += len(item.data) + 1
                if slice_left > 0:
                    lines.append(item.data)
                    slice_left -= len(item.data) + 1
                doc = parse_record(item.data, config.text_field, config.source_fields)
                if not isinstance(doc, Document):
                    if doc.kind == "dead_letter":
                        s.dead_letters += 1
                    else:
                        s.filtered += 1
                else:
                    _add_document(s, doc, config, sp, file_chars, (input_splits or {}).get(row["path"], HASHED))
                    if file_chars > 0:
                        file_chars -= len(doc.text)
                if stream.count >= budget_per_file:
                    break
            s.input_bytes += stream.count
        if lines:
            s.slices.append((row["path"], lines))
        chars_left -= per_file_chars
        s.read_cpu_s += time.process_time() - t0
    s.read_cpu_s -= s.tokenize_cpu_s
    return s


def _add_document(s: Sample, doc: Document, config: ShardConfig, sp, chars_budget: int,
                  input_split: int = HASHED) -> None:
    split = assign_split(doc.doc_id, input_split, config.val_fraction, config.test_fraction)
    n_bytes = len(doc.text.encode("utf-8"))
    src = s.by_source.setdefault(doc.source, SourceSample())
    s.documents += 1
    s.text_bytes += n_bytes
    s.split_docs[split] += 1
    s.split_text_bytes[split] += n_bytes
    src.documents += 1
    src.text_bytes += n_bytes
    src.split_docs[split] += 1
    if chars_budget > 0:
        t0 = time.process_time()
        ids = sp.encode(doc.text)
        cpu = time.process_time() - t0
        s.tokenize_cpu_s += cpu
        s.tokenized_tokens += len(ids)
        s.tokenized_text_bytes += n_bytes
        s.split_tokens[split] += len(ids)
        src.tokenize_cpu_s += cpu
        src.tokenized_tokens += len(ids)
        src.tokenized_text_bytes += n_bytes
        src.split_tokens[split] += len(ids)
        if len(s.token_arrays) < 4 * ENCODE_EXAMPLES:
            s.token_arrays.append(np.asarray(ids, dtype=np.int64))
    else:
        s.untokenized_split_bytes[split] += n_bytes
        src.untokenized_split_bytes[split] += n_bytes


def output_bytes_per_example(s: Sample, seq_len: int, eos_id: int, pad_id: int) -> tuple:
    """(bytes per framed example, CPU seconds per example) from packing and framing sampled documents a block at
    a time, as the shard stage does (transforms/shard/stages.py pack_shard: pack_blocks, frame_examples)."""
    eos = np.array([eos_id], dtype=np.int64)
    docs = ((i, np.concatenate((t, eos))) for i, t in enumerate(s.token_arrays))
    n, total, t0 = 0, 0, time.process_time()
    for block in pack_blocks(docs, seq_len, pad_id, block_examples=min(BLOCK_EXAMPLES, ENCODE_EXAMPLES)):
        if block.padding and n:  # the last, padded block is not typical
            break
        total += len(frame_examples(block.columns(), block.examples))
        n += block.examples
        if n >= ENCODE_EXAMPLES:
            break
    cpu = time.process_time() - t0
    if not n:
        return 8.0 * seq_len, 0.0
    return total / n, cpu / n


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
    tokens_per_split: dict
    examples: int
    shards: int
    shards_per_split: dict
    output_bytes: int
    core_hours: float
    nothing_to_do: bool = False
    notes: list = field(default_factory=list)
    workers: int = 1
    wall_s: float = 0.0  # driver planning + core-hours / workers (perfect scaling: a lower bound)
    startup_s: float = 0.0
    startup_core_s: float = 0.0  # included in core_hours: a run's CPU whatever its input (see the docstring)
    sources: dict = field(default_factory=dict)  # source -> {documents, tokens, text_bytes, tokenize_core_s}
    calibration: Optional["Calibration"] = None


@dataclass(frozen=True)
class Calibration:
    """The job run on a slice of the sample and on its first half: its marginal CPU per raw byte beside the stage
    model's for the same slice, and the CPU a run spends above a one-record run whatever its size (shards,
    units, planning: `overhead_cpu_s`) and the one-record run's own (`one_record_cpu_s`, the first job run in
    this process: lazy imports, planning, graph, runner, commit)."""
    raw_bytes: int
    job_cpu_per_byte: float
    model_cpu_per_byte: float
    overhead_cpu_s: float
    one_record_cpu_s: float = 0.0

    @property
    def factor(self) -> float:
        """The job's CPU per byte over the model's on the slice (shown in the note; the estimate adds the
        difference, `extra_cpu_per_byte`)."""
        if self.model_cpu_per_byte > 0 and self.job_cpu_per_byte > 0:
            return self.job_cpu_per_byte / self.model_cpu_per_byte
        return 1.0

    @property
    def extra_cpu_per_byte(self) -> float:
        """What the job spends per raw byte around the modelled stages (document ids, statistics, spill, hashing,
        the runner's per-element cost). Added, not multiplied: that work does not depend on how fast the
        tokenizer is, and the slice (the first lines of each sampled file) tokenizes at another rate than the
        whole input. Scaling the model by the slice's ratio overestimated a 384 MB run by 1.3-1.6x; adding gave
        0.91 (96 MB) and 1.02 (384 MB) of the real runs (bench/dry_run_bench.py; repeats in docs/PILE.md). Never below 0: the job runs every stage the
        model times, so a lower job rate is timing noise."""
        return max(0.0, self.job_cpu_per_byte - self.model_cpu_per_byte)


def process_cpu_s() -> float:
    import resource  # noqa: PLC0415

    r = resource.getrusage(resource.RUSAGE_SELF)  # the in-memory runner's workers are threads of this process
    return r.ru_utime + r.ru_stime


_IN_PROCESS = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


def write_slices(slices: list, directory: str) -> list:
    """The calibration input: each sampled file's slice of raw lines, compressed as the file was."""
    import gzip  # noqa: PLC0415

    import zstandard  # noqa: PLC0415

    paths = []
    for i, (path, lines) in enumerate(slices):
        body = b"".join(line + b"\n" for line in lines)
        kind = compression_of(path)
        suffix = {"zstd": ".jsonl.zst", "gzip": ".jsonl.gz"}.get(kind, ".jsonl")
        data = zstandard.ZstdCompressor(level=3).compress(body) if kind == "zstd" else (
            gzip.compress(body, compresslevel=6) if kind == "gzip" else body)
        out = os.path.join(directory, f"slice-{i:03d}{suffix}")
        with open(out, "wb") as f:
            f.write(data)
        paths.append(out)
    return paths


def calibrate(config: ShardConfig, slices: list) -> Optional[Calibration]:
    """Run the job in this process on one record of `slices`, then CALIBRATION_REPEATS times on their first
    halves and on them whole, in a temporary directory this function creates and removes; the stage model's
    estimate for the same slice beside it."""
    import dataclasses  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    from pipeline.shard import shard_pipeline  # noqa: PLC0415

    if not slices:
        return None
    root = tempfile.mkdtemp(prefix="pileprep-dry-run-")
    try:
        os.mkdir(os.path.join(root, "in"))
        os.mkdir(os.path.join(root, "one"))
        paths = write_slices(slices, os.path.join(root, "in"))
        write_slices([(slices[0][0], slices[0][1][:1])], os.path.join(root, "one"))
        base = dict(val_inputs=(), test_inputs=(), staging_dir=None, allow_unknown_sources=True,
                    num_shards=config.num_shards or 1)
        one = dataclasses.replace(config, inputs=(os.path.join(root, "one", "*"),),
                                  output=os.path.join(root, "one-out"), **{**base, "source_weights": ""})
        full = dataclasses.replace(config, inputs=(os.path.join(root, "in", "*"),), output=os.path.join(root, "out"),
                                   **base)
        half = dataclasses.replace(full, inputs=(os.path.join(root, "half", "*"),),
                                   output=os.path.join(root, "half-out"))
        os.mkdir(os.path.join(root, "half"))
        write_slices([(p, lines[:max(1, len(lines) // 2)]) for p, lines in slices], os.path.join(root, "half"))
        cpu = [math.inf] * 3  # the least CPU of each size's runs: contention from other work only adds to it
        for i, cfg in [(0, one)] + [(1, half), (2, full)] * CALIBRATION_REPEATS:
            c0 = process_cpu_s()
            shard_pipeline.run_outcome(cfg, _IN_PROCESS, progress_every_s=0)
            cpu[i] = min(cpu[i], process_cpu_s() - c0)
            shutil.rmtree(cfg.output, ignore_errors=True)  # the next run of this size starts from nothing again
        raw = sum(len(line) + 1 for _p, lines in slices for line in lines)
        raw_half = sum(len(line) + 1 for _p, lines in slices for line in lines[:max(1, len(lines) // 2)])
        model = estimate(dataclasses.replace(full, output=os.path.join(root, "model-never")), _IN_PROCESS,
                         sample_files=len(paths), budget_per_file=1 << 62, workers=1, calibrated=False)
        job_per_byte = (cpu[2] - cpu[1]) / (raw - raw_half) if raw > raw_half else 0.0
        overhead = max(0.0, (cpu[2] - cpu[0]) - job_per_byte * raw)
        return Calibration(raw_bytes=raw, job_cpu_per_byte=max(job_per_byte, 0.0),
                           model_cpu_per_byte=model.core_hours * 3600.0 / raw, overhead_cpu_s=overhead,
                           one_record_cpu_s=cpu[0])  # the first run here: it pays the lazy imports too
    finally:
        shutil.rmtree(root, ignore_errors=True)


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
    set_filesystem_options(shard_pipeline.pipeline_options(beam_args))
    plan = shard_pipeline.prepare(config, incremental_run)
    startup_s = time.monotonic() - t_start
    planning_cpu_s = process_cpu_s() - cpu_0  # a real run's driver plans the same way (imports, tokenizer, listing)
    rows = list(plan.input_rows)
    total_in = sum(r["bytes"] for r in rows)
    if plan.nothing_to_do or not rows:
        return Estimate(0, 0, 0, 0, 0, 0, 0, 0, 0, {}, 0, 0, {}, 0, 0.0, nothing_to_do=True)
    sp = tokenizer.load_processor(plan.model_bytes, config.tokenizer, tokenizer.options_of(config))
    if plan.tokenizer_backend is not None:  # the encoder the job's workers would run, so its rate is theirs
        from transforms.tokenize import tokenizer_backends  # noqa: PLC0415

        sp = tokenizer_backends.make_encoder(plan.tokenizer_backend, plan.model_bytes, sp)
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
    examples = 0.0
    for i in range(len(SPLITS)):
        n_shards = shards_per_split[SPLITS[i]]
        if n_shards:  # documents + one EOS each, packed per shard; the last example of a shard is padded
            examples += (split_tokens[i] + split_docs[i]) / config.seq_len + n_shards / 2
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
    calibration = calibrate(config, [sl for _p, smp, _scale in parts for sl in smp.slices]) if calibrated else None
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
                             for n, r in sorted(sources.items())}, calibration=calibration)


def format_estimate(e: Estimate) -> str:
    if e.nothing_to_do:
        return "dry run: nothing to do (the dataset already holds every input file); nothing was written"
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
    for name, r in e.sources.items():
        rows.append((f"  source {_safe(name)[:40]}", f"{r['tokens']:,}",
                     f"tokens; {r['documents']:,} documents, {r['tokenize_core_s'] / 3600:,.3f} core-hours tokenizing"))
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = ["dry run (nothing written): estimates from a sample of the inputs"]
    lines += [f"  {r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]}" for r in rows]
    lines += [f"  note: {n}" for n in e.notes]
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
