"""The dry run's stage model (pipeline/tools/dry_run.py): a few input files read, parsed, tokenized and packed as
the shard job's stages do it, with the CPU each stage took.

A few input files spread over the listing are read through the job's reader and parser, up to a byte budget each:
the ratio of raw JSON to input bytes and of documents and text to raw bytes scale the sample up to the whole
input. Documents are tokenized (up to a character budget; beyond it tokens are scaled from bytes) with the real
tokenizer and assigned to splits with the job's own split function, per source (code, prose and maths tokenize at
different rates), and sampled examples are packed and framed exactly as the shard stage does. The raw lines read
first are kept as the calibration's slice (pipeline/tools/dry_run_calibration.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from model_contract import frame_examples
from pipeline.config import ShardConfig
from transforms.io import io_utils
from transforms.io.read_records import FileDamage, compression_of, iter_raw_records
from transforms.shard.documents import HASHED, SPLITS, Document, assign_split, parse_record
from transforms.shard.packing import BLOCK_EXAMPLES, pack_blocks

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
class Tally:
    """Documents, bytes and tokens of a sample, or of one source's share of it (its own tokenize rate: CPU s and
    tokens per text byte). Tokenized documents count exactly; the rest by their bytes, scaled at the rate."""
    documents: int = 0
    text_bytes: int = 0
    tokenized_text_bytes: int = 0
    tokenized_tokens: int = 0
    tokenize_cpu_s: float = 0.0
    split_docs: list[int] = field(default_factory=lambda: [0] * len(SPLITS))
    split_tokens: list[int] = field(default_factory=lambda: [0] * len(SPLITS))  # of the tokenized documents
    untokenized_split_bytes: list[int] = field(default_factory=lambda: [0] * len(SPLITS))

    def add(self, split: int, n_bytes: int, n_tokens: Optional[int], cpu_s: float = 0.0) -> None:
        """One document of `n_bytes` text bytes in `split`; `n_tokens` None: not tokenized (out of budget)."""
        self.documents += 1
        self.text_bytes += n_bytes
        self.split_docs[split] += 1
        if n_tokens is None:
            self.untokenized_split_bytes[split] += n_bytes
            return
        self.tokenize_cpu_s += cpu_s
        self.tokenized_tokens += n_tokens
        self.tokenized_text_bytes += n_bytes
        self.split_tokens[split] += n_tokens

    def tokens_per_byte(self, fallback: float) -> float:
        return self.tokenized_tokens / self.tokenized_text_bytes if self.tokenized_text_bytes else fallback

    def cpu_per_byte(self, fallback: float) -> float:
        return self.tokenize_cpu_s / self.tokenized_text_bytes if self.tokenized_text_bytes else fallback

    def split_token_estimate(self, fallback_rate: float) -> list:
        rate = self.tokens_per_byte(fallback_rate)
        return [self.split_tokens[i] + self.untokenized_split_bytes[i] * rate for i in range(len(SPLITS))]


@dataclass
class Sample(Tally):
    """The whole sample: its Tally, what reading it cost and found, and one Tally per source."""
    input_bytes: int = 0  # compressed bytes consumed
    raw_bytes: int = 0  # JSON lines (decompressed)
    records: int = 0
    split_text_bytes: list[int] = field(default_factory=lambda: [0] * len(SPLITS))
    dead_letters: int = 0
    filtered: int = 0
    read_cpu_s: float = 0.0
    token_arrays: list[np.ndarray] = field(default_factory=list)  # a few documents' int64 tokens (output size)
    by_source: dict[str, Tally] = field(default_factory=dict)  # by source name
    # (input path, its raw lines): the calibration run's input (dry_run_calibration.write_slices)
    slices: list[tuple[str, list[bytes]]] = field(default_factory=list)


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
    s.split_text_bytes[split] += n_bytes
    n_tokens, cpu = None, 0.0
    if chars_budget > 0:
        t0 = time.process_time()
        ids = sp.encode(doc.text)
        cpu, n_tokens = time.process_time() - t0, len(ids)
        if len(s.token_arrays) < 4 * ENCODE_EXAMPLES:
            s.token_arrays.append(np.asarray(ids, dtype=np.int64))
    for tally in (s, s.by_source.setdefault(doc.source, Tally())):
        tally.add(split, n_bytes, n_tokens, cpu)


def output_bytes_per_example(s: Sample, seq_len: int, eos_id: int, pad_id: int) -> tuple:
    """(bytes per framed example, CPU seconds per example) from packing and framing sampled documents a block at
    a time, as the shard stage does (transforms/shard/pack.py pack_shard: pack_blocks, frame_examples)."""
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
