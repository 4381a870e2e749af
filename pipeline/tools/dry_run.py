"""`pileprep shard --dry-run`: what a run would make, estimated from a sample of the inputs; writes nothing.

The driver's own planning (`shard_pipeline.prepare`: config validation, input listing, tokenizer, committed
manifest for `--incremental`) runs as in a real run, so every configuration error a real run would report
before starting is reported here too. Then a few input files spread over the listing are read through the
job's reader and parser, up to a byte budget each: the ratio of raw JSON to input bytes and of documents and
text to raw bytes scale the sample up to the whole input. Documents are tokenized (up to a character budget;
beyond it tokens are scaled from bytes) with the real tokenizer and assigned to splits with the job's own
split function, shard counts come from the job's own shard planner, and output bytes from packing and encoding
sampled examples exactly as the shard stage does. Core-hours are the CPU time the sample took per stage
(read+parse, tokenize, pack+encode), scaled — a machine-dependent estimate, not a promise.

Not modelled: exact duplicates (removed by the job), and compression ratios that change inside a file beyond
the sampled prefix.
"""
from __future__ import annotations

import math
import time
import types
from dataclasses import dataclass, field

import numpy as np

from model_contract import encode_example, frame_record
from pipeline.config import ShardConfig
from transforms.io import io_utils
from transforms.shard.documents import HASHED, SPLITS, Document, assign_split, parse_record
from transforms.shard.packing import pack_documents
from transforms.io.read_records import FileDamage, compression_of, iter_raw_records

MAX_SAMPLE_FILES = 16
SAMPLE_INPUT_BYTES_PER_FILE = 16 << 20  # compressed bytes read per sampled file, at most
TOKENIZE_CHARS = 8_000_000  # characters tokenized in all; further documents' tokens are scaled from bytes
ENCODE_EXAMPLES = 256  # examples packed and encoded to measure output bytes per example


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


def pick_files(rows: list, n: int = MAX_SAMPLE_FILES) -> list:
    """Up to n rows spread evenly over the (sorted) listing, always including the first and the last."""
    if len(rows) <= n:
        return list(rows)
    idx = sorted({round(i * (len(rows) - 1) / (n - 1)) for i in range(n)})
    return [rows[i] for i in idx]


def sample_inputs(rows: list, config: ShardConfig, sp, budget_per_file: int = SAMPLE_INPUT_BYTES_PER_FILE,
                  tokenize_chars: int = TOKENIZE_CHARS, input_splits: dict = None) -> Sample:
    """`input_splits`: path -> the split a --val-input / --test-input file goes to whole (HASHED otherwise)."""
    s = Sample()
    chars_left = tokenize_chars
    per_file_chars = max(1, tokenize_chars // max(1, len(rows)))
    for row in rows:
        file_chars = min(per_file_chars, chars_left)
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
        chars_left -= per_file_chars
        s.read_cpu_s += time.process_time() - t0
    s.read_cpu_s -= s.tokenize_cpu_s
    return s


def _add_document(s: Sample, doc: Document, config: ShardConfig, sp, chars_budget: int,
                  input_split: int = HASHED) -> None:
    split = assign_split(doc.doc_id, input_split, config.val_fraction, config.test_fraction)
    n_bytes = len(doc.text.encode("utf-8"))
    s.documents += 1
    s.text_bytes += n_bytes
    s.split_docs[split] += 1
    s.split_text_bytes[split] += n_bytes
    if chars_budget > 0:
        t0 = time.process_time()
        ids = sp.encode(doc.text)
        s.tokenize_cpu_s += time.process_time() - t0
        s.tokenized_tokens += len(ids)
        s.tokenized_text_bytes += n_bytes
        s.split_tokens[split] += len(ids)
        if len(s.token_arrays) < 4 * ENCODE_EXAMPLES:
            s.token_arrays.append(np.asarray(ids, dtype=np.int64))
    else:
        s.untokenized_split_bytes[split] += n_bytes


def output_bytes_per_example(s: Sample, seq_len: int, eos_id: int, pad_id: int) -> tuple:
    """(bytes per framed example, CPU seconds per example) from packing and encoding sampled documents."""
    eos = np.array([eos_id], dtype=np.int64)
    docs = ((i, np.concatenate((t, eos))) for i, t in enumerate(s.token_arrays))
    n, total, t0 = 0, 0, time.process_time()
    for example in pack_documents(docs, seq_len, pad_id):
        if example.padding and n:  # the last, padded example is not typical
            break
        total += len(frame_record(encode_example(example.features())))
        n += 1
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


def estimate(config: ShardConfig, beam_args=None, incremental_run: bool = False, sample_files: int = MAX_SAMPLE_FILES,
             budget_per_file: int = SAMPLE_INPUT_BYTES_PER_FILE) -> Estimate:
    from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415

    from pipeline.shard import shard_pipeline  # noqa: PLC0415
    from pipeline.shard.manifest_builder import plan_shard_tasks  # noqa: PLC0415
    from transforms.tokenize import tokenizer  # noqa: PLC0415

    FileSystems.set_options(shard_pipeline.pipeline_options(beam_args))
    plan = shard_pipeline.prepare(config, incremental_run)
    rows = list(plan.input_rows)
    total_in = sum(r["bytes"] for r in rows)
    if plan.nothing_to_do or not rows:
        return Estimate(0, 0, 0, 0, 0, 0, 0, 0, 0, {}, 0, 0, {}, 0, 0.0, nothing_to_do=True)
    sp = tokenizer.load_processor(plan.model_bytes, config.tokenizer)
    # --val-input / --test-input files go whole to their split: sampled and scaled as a group of their own, so a
    # small official val file is neither skipped by the file pick nor scaled by the train files' size.
    input_splits = dict(zip((path for path, _size in plan.ledger), plan.input_splits))
    groups = ([r for r in rows if input_splits.get(r["path"], HASHED) == HASHED],
              [r for r in rows if input_splits.get(r["path"], HASHED) != HASHED])
    parts = []  # (picked rows, sample, scale)
    for group in groups:
        if group:
            picked = pick_files(group, sample_files)
            sample = sample_inputs(picked, config, sp, budget_per_file, input_splits=input_splits)
            scale = sum(r["bytes"] for r in group) / sample.input_bytes if sample.input_bytes else 0.0
            parts.append((picked, sample, scale))
    split_tokens = [0.0] * len(SPLITS)
    split_docs = [0.0] * len(SPLITS)
    raw_bytes = records = documents = dead_letters = core_s = 0.0
    for _picked, s, scale in parts:
        tokens_per_byte = s.tokenized_tokens / s.tokenized_text_bytes if s.tokenized_text_bytes else 0.0
        for i in range(len(SPLITS)):
            split_tokens[i] += (s.split_tokens[i] + s.untokenized_split_bytes[i] * tokens_per_byte) * scale
            split_docs[i] += s.split_docs[i] * scale
        raw_bytes += s.raw_bytes * scale
        records += s.records * scale
        documents += s.documents * scale
        dead_letters += s.dead_letters * scale
        core_s += s.read_cpu_s * scale + (s.tokenize_cpu_s / s.tokenized_text_bytes * s.text_bytes * scale
                                          if s.tokenized_text_bytes else 0.0)
    units = [types.SimpleNamespace(split_tokens=[int(round(t)) for t in split_tokens])]
    tasks = plan_shard_tasks(units, config)
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
    return Estimate(files=len(rows), input_bytes=total_in, sampled_files=sampled_files,
                    sampled_input_bytes=sampled_bytes, raw_bytes=int(raw_bytes),
                    records=int(round(records)), documents=int(round(documents)),
                    dead_letters=int(round(dead_letters)), tokens=tokens,
                    tokens_per_split={SPLITS[i]: int(round(t)) for i, t in enumerate(split_tokens)},
                    examples=int(math.ceil(examples)), shards=len(tasks), shards_per_split=shards_per_split,
                    output_bytes=int(examples * bytes_per_example), core_hours=core_s / 3600.0, notes=notes)


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
        ("core-hours", f"{e.core_hours:,.3f}", "CPU time on this machine, scaled from the sample"),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = ["dry run (nothing written): estimates from a sample of the inputs"]
    lines += [f"  {r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]}" for r in rows]
    lines += [f"  note: {n}" for n in e.notes]
    return "\n".join(lines)
