"""Training a SentencePiece model on a Pile-format corpus, deterministically and within a size bound.

Documents are read with the pipeline's own reader (`iter_raw_records` + `parse_record`), so the tokenizer sees
exactly the text the shards will hold; damaged files and bad records are counted, not fatal. Memory is bounded
the same way as the shard job's: a line over `max_line_bytes` (the shard job's `--max-line-mb` default) is
counted as `line_too_long` and skipped while it streams, and zstd windows above `max_zstd_window_bytes` are
refused, so a few KB of hostile zstd cannot make training hold gigabytes. Each document is
cut into pieces of whole lines (at most `max_sentence_chars`, longer lines cut), and a seeded hash of
(file, line, piece index) keeps at most `max_sentences` pieces: the same input gives the same sample, whatever
the file listing order. Pieces keep their newlines and indentation, so the model learns "\\n" and
whitespace-run pieces that code is full of.

The model round-trips text exactly: identity normalisation, no dummy prefix, no whitespace collapsing, and
byte fallback for anything outside the vocabulary (no <unk> for an emoji or a rare CJK character).

Special ids (fixed, the contract reads them from the model): pad=0, unk=1, bos=2, eos=3.

`kind="hf-bpe"` (`train_hf_bpe`) trains an HF `tokenizers` byte-level BPE instead, with GPT-NeoX-20B's
pre-tokenizer, post-processor and decoder settings (ByteLevel, no prefix space), its two special tokens
(`<|endoftext|>` = 0, the end of document; `<|padding|>` = 1) and non-special added tokens for whitespace runs
(as GPT-NeoX has): written as a tokenizer.json, plus a tiktoken BPE file of the same merges beside it
(transforms/tokenize/tiktoken_file.py).
"""
from __future__ import annotations

import hashlib
import heapq
import io
import os
import stat
import struct
import time
from dataclasses import dataclass, field

from pipeline.errors import ConfigError
from pipeline.ops.input_checks import match_input, readable_inputs

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
MIN_VOCAB_SIZE = 4 + 256 + 1  # specials + the 256 byte pieces + at least one learned piece


@dataclass
class _ReadStats:
    files: int = 0
    documents: int = 0
    rejected: dict[str, int] = field(default_factory=dict)  # reason -> count (file damage and record rejections)


def _list_inputs(input_globs: list[str]) -> list[str]:
    if not input_globs:
        raise ConfigError("no --input given: pass one or more file globs of jsonl / jsonl.zst / jsonl.gz files")
    paths = set()
    for pattern in input_globs:
        try:
            found = [m.path for m in match_input(pattern)]
        except Exception as e:  # noqa: BLE001 - Beam raises BeamIOError / OSError depending on the filesystem
            raise ConfigError(f"cannot list input glob {pattern!r}: {e}") from None
        if not found:
            raise ConfigError(f"input glob {pattern!r} matched no files")
        paths.update(found)
    # pipeline/ops/input_checks.py: a FIFO or a link to /dev/zero blocked the sample's first read forever
    return readable_inputs(sorted(paths), "--input", "the tokenizer's training sample")


def _pieces(text: str, max_chars: int):
    """Cut a document into runs of whole lines ("\\n" kept) of at most max_chars; over-long lines are cut."""
    buf, size = [], 0
    for line in text.split("\n"):
        line += "\n"
        while len(line) > max_chars:
            if buf:
                yield "".join(buf)
                buf, size = [], 0
            yield line[:max_chars]
            line = line[max_chars:]
        if size + len(line) > max_chars and buf:
            yield "".join(buf)
            buf, size = [], 0
        buf.append(line)
        size += len(line)
    if buf:
        last = "".join(buf)[:-1]  # the final "\n" was added by the split, not in the text
        if last.strip():
            yield last


def _rank(seed: int, path: str, line: int, index: int) -> int:
    h = hashlib.blake2b(digest_size=8, person=b"pileprep-tok")
    h.update(struct.pack("<qqq", seed, line, index))
    h.update(path.encode("utf-8"))
    return struct.unpack("<Q", h.digest())[0]


def _sample_sentences(paths: list[str], max_sentences: int, max_chars: int, seed: int,
                      stats: _ReadStats, max_line_bytes: int, max_zstd_window_bytes: int) -> list[str]:
    """The max_sentences pieces with the smallest seeded rank, in input order (a bottom-k sample)."""
    from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415

    from transforms.shard.documents import Document, parse_record  # noqa: PLC0415
    from transforms.io.read_records import FileDamage, compression_of, iter_raw_records  # noqa: PLC0415

    heap: list[tuple[int, int, str]] = []  # (-rank, order, piece): the max_sentences smallest ranks
    order = 0
    for path in paths:
        stats.files += 1
        with FileSystems.open(path, compression_type="uncompressed") as stream:
            for item in iter_raw_records(stream, compression_of(path), max_line_bytes, max_zstd_window_bytes):
                if isinstance(item, FileDamage):
                    stats.rejected[item.reason] = stats.rejected.get(item.reason, 0) + 1
                    continue
                result = parse_record(item.data)
                if not isinstance(result, Document):
                    stats.rejected[result.reason] = stats.rejected.get(result.reason, 0) + 1
                    continue
                stats.documents += 1
                for i, piece in enumerate(_pieces(result.text, max_chars)):
                    entry = (-_rank(seed, path, item.line, i), order, piece)
                    order += 1
                    if len(heap) < max_sentences:
                        heapq.heappush(heap, entry)
                    elif entry > heap[0]:  # smaller rank than the largest kept
                        heapq.heapreplace(heap, entry)
    return [piece for _, _, piece in sorted(heap, key=lambda e: e[1])]


def _read_training_sample(input_globs, max_sentences: int, max_sentence_chars: int, seed: int,
                          max_line_bytes, max_zstd_window_bytes) -> tuple:
    """The deterministic, size-bounded training sample both kinds of tokenizer train on, read with the
    pipeline's own reader: (sentences, read stats, input paths, seconds spent reading)."""
    from transforms.io.decompress import DEFAULT_MAX_ZSTD_WINDOW_BYTES  # noqa: PLC0415
    from transforms.io.read_records import DEFAULT_MAX_LINE_BYTES  # noqa: PLC0415

    if max_sentences < 1 or max_sentence_chars < 16:
        raise ValueError("max_sentences must be >= 1 and max_sentence_chars >= 16")
    start = time.perf_counter()
    paths = _list_inputs(list(input_globs))
    stats = _ReadStats()
    sentences = _sample_sentences(paths, max_sentences, max_sentence_chars, seed, stats,
                                  max_line_bytes or DEFAULT_MAX_LINE_BYTES,
                                  max_zstd_window_bytes or DEFAULT_MAX_ZSTD_WINDOW_BYTES)
    if not sentences:
        raise ConfigError(f"the inputs {list(input_globs)} ({len(paths)} files) hold no usable documents "
                         f"(rejected: {stats.rejected})")
    return sentences, stats, paths, time.perf_counter() - start


def check_outputs(input_globs, outputs: list, overwrite: bool) -> None:
    """ConfigError (exit 2) before any work when a file this command would write is one of its inputs (never
    written, whatever the flags: it would replace the corpus it reads), or already exists and `overwrite` is off
    (`--overwrite`): this command does not know who made it (`hf-bpe --output x.json` also writes `x.tiktoken`
    beside it, which replaced a user's file of that name unseen), and replaces nothing it was not told to.
    A local output path through a symbolic link to a directory is fine (the user named it); a link at the file
    itself is replaced, never written through (io_utils.publish_bytes renames over it)."""
    if isinstance(input_globs, str):
        input_globs = [input_globs]
    local = [o for o in outputs if "://" not in o]
    inputs = {os.path.realpath(p) for p in _list_inputs(list(input_globs)) if "://" not in p}
    for out in local:
        if os.path.realpath(out) in inputs:
            raise ConfigError(f"--output {out} is one of the --input files: training would replace the corpus it "
                              f"reads; choose another --output")
        if os.path.isdir(out):
            raise ConfigError(f"--output {out}: it is a directory; the tokenizer is a file: name the file")
        if os.path.lexists(out) and not stat.S_ISREG(os.lstat(out).st_mode):
            # even with --overwrite: replacing /dev/null, a FIFO or a link with a regular file is never asked for
            raise ConfigError(f"--output {out}: it exists and is not a regular file (a device, FIFO, socket or "
                              f"link); --overwrite replaces only regular files: choose another --output")
    existing = [o for o in outputs if (os.path.lexists(o) if "://" not in o else _exists(o))]
    if existing and not overwrite:
        raise ConfigError(f"--output: {', '.join(existing)} already exist{'s' * (len(existing) == 1)}, and this "
                          f"command did not create it in this run; pass --overwrite to replace it, or choose "
                          f"another --output")


def _exists(path: str) -> bool:
    from transforms.io import io_utils  # noqa: PLC0415

    return io_utils.exists(path)


def train_tokenizer(input_globs: list[str], output_path: str, vocab_size: int, *,
                    max_sentences: int = 200_000, max_sentence_chars: int = 4096,
                    model_type: str = "bpe", seed: int = 0, max_line_bytes: int | None = None,
                    max_zstd_window_bytes: int | None = None, overwrite: bool = False) -> dict:
    """Train a byte-fallback SentencePiece model on the documents of `input_globs`; write it to output_path."""
    if isinstance(input_globs, str):
        input_globs = [input_globs]
    check_outputs(input_globs, [output_path], overwrite)
    import sentencepiece as spm  # noqa: PLC0415

    if isinstance(input_globs, str):
        input_globs = [input_globs]
    if vocab_size < MIN_VOCAB_SIZE:
        raise ConfigError(f"--vocab-size {vocab_size} is too small: byte fallback needs 4 special + 256 byte "
                         f"pieces, so use at least {MIN_VOCAB_SIZE}")
    if model_type not in ("bpe", "unigram"):
        raise ValueError(f"model_type must be 'bpe' or 'unigram', got {model_type!r}")
    start = time.perf_counter()
    sentences, stats, paths, read_s = _read_training_sample(input_globs, max_sentences, max_sentence_chars, seed,
                                                            max_line_bytes, max_zstd_window_bytes)

    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model,
            model_type=model_type, vocab_size=vocab_size,
            byte_fallback=True, character_coverage=0.9995,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            normalization_rule_name="identity", add_dummy_prefix=False, remove_extra_whitespaces=False,
            split_digits=True, allow_whitespace_only_pieces=True, split_by_whitespace=True,
            max_sentence_length=max_sentence_chars * 4,  # bytes: never silently drop a sampled piece
            input_sentence_size=0, shuffle_input_sentence=False,  # we sampled already, deterministically
            # Fixed, not os.cpu_count(): the model bytes depend on the thread count (1 and 2 threads give different,
            # each repeatable, models), so a fixed count keeps the sha256 the same on every machine.
            num_threads=1,
            minloglevel=2,
        )
    except RuntimeError as e:
        msg = str(e)
        if "smaller than required_chars" in msg:
            raise ConfigError(f"--vocab-size {vocab_size} is too small for the distinct characters of this data "
                             f"({msg.strip()}); raise --vocab-size") from None
        if "Vocabulary size" in msg or "vocab_size" in msg:
            raise ConfigError(f"--vocab-size {vocab_size} is too large for this data ({len(sentences)} sentences, "
                             f"{stats.documents} documents): {msg.strip()}; lower --vocab-size or give more "
                             f"input") from None
        raise ValueError(f"SentencePiece training failed: {msg.strip()}") from None
    blob = model.getvalue()

    parent = os.path.dirname(output_path)
    if parent and "://" not in output_path:
        os.makedirs(parent, exist_ok=True)
    _write_atomically(output_path, blob)
    return {
        "output": output_path,
        "vocab_size": vocab_size,
        "model_type": model_type,
        "special_ids": {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID},
        "files": stats.files,
        "documents": stats.documents,
        "rejected": dict(sorted(stats.rejected.items())),
        "sentences": len(sentences),
        "sentence_chars": sum(map(len, sentences)),
        "model_sha256": hashlib.sha256(blob).hexdigest(),
        "model_bytes": len(blob),
        "read_seconds": round(read_s, 3),
        "seconds": round(time.perf_counter() - start, 3),
    }


KINDS = ("sentencepiece", "hf-bpe")
HF_SPECIAL_TOKENS = ("<|endoftext|>", "<|padding|>")
# Non-special added tokens: whitespace runs (indentation), matched whole before the pre-tokenizer as in GPT-NeoX.
HF_WHITESPACE_RUNS = (" " * 4, " " * 8, " " * 16, "\t\t")
HF_MIN_VOCAB_SIZE = len(HF_SPECIAL_TOKENS) + 256 + 1


def train(kind: str, input_globs: list, output_path: str, vocab_size: int, **kwargs) -> dict:
    """`pileprep tokenizer train --kind`: a SentencePiece model or an HF byte-level BPE tokenizer.json."""
    if kind not in KINDS:
        raise ConfigError(f"--kind {kind!r}: choose one of {', '.join(KINDS)}")
    return (train_tokenizer if kind == "sentencepiece" else train_hf_bpe)(input_globs, output_path, vocab_size,
                                                                           **kwargs)


def tiktoken_path_for(output_path: str) -> str:
    """Where the tiktoken file of a trained tokenizer.json goes: beside it, `.json` replaced by `.tiktoken`."""
    return (output_path[:-len(".json")] if output_path.endswith(".json") else output_path) + ".tiktoken"


def train_hf_bpe(input_globs: list, output_path: str, vocab_size: int, *, max_sentences: int = 200_000,
                 max_sentence_chars: int = 4096, seed: int = 0, max_line_bytes: int | None = None,
                 max_zstd_window_bytes: int | None = None, overwrite: bool = False) -> dict:
    """Train a byte-level BPE (GPT-NeoX settings) on the documents of `input_globs`; write the tokenizer.json to
    output_path and its tiktoken file to `tiktoken_path_for(output_path)`."""
    from tokenizers import (AddedToken, Tokenizer, decoders, models,  # noqa: PLC0415 - only when training
                            pre_tokenizers, processors, trainers)

    from transforms.tokenize import tiktoken_file  # noqa: PLC0415

    if isinstance(input_globs, str):
        input_globs = [input_globs]
    check_outputs(input_globs, [output_path, tiktoken_path_for(output_path)], overwrite)
    if vocab_size < HF_MIN_VOCAB_SIZE:
        raise ConfigError(f"--vocab-size {vocab_size} is too small: byte-level BPE needs {len(HF_SPECIAL_TOKENS)} "
                         f"special + 256 byte tokens, so use at least {HF_MIN_VOCAB_SIZE}")
    start = time.perf_counter()
    sentences, stats, paths, read_s = _read_training_sample(input_globs, max_sentences, max_sentence_chars, seed,
                                                            max_line_bytes, max_zstd_window_bytes)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(HF_SPECIAL_TOKENS), min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(sentences, trainer, length=len(sentences))
    tok.add_tokens([AddedToken(run, special=False, normalized=True) for run in HF_WHITESPACE_RUNS])
    blob = tok.to_str().encode("utf-8")
    tiktoken_blob, special = tiktoken_file.from_tokenizer_json(blob)
    parent = os.path.dirname(output_path)
    if parent and "://" not in output_path:
        os.makedirs(parent, exist_ok=True)
    tiktoken_path = tiktoken_path_for(output_path)
    _write_atomically(output_path, blob)
    _write_atomically(tiktoken_path, tiktoken_blob)
    return {
        "output": output_path,
        "kind": "hf-bpe",
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "special_tokens": special,
        "eos_token": HF_SPECIAL_TOKENS[0],
        "tiktoken": {"output": tiktoken_path, "pattern": "gpt2",
                     "model_sha256": hashlib.sha256(tiktoken_blob).hexdigest(),
                     "special_tokens": tiktoken_file.special_tokens_spec(special)},
        "files": stats.files,
        "documents": stats.documents,
        "rejected": dict(sorted(stats.rejected.items())),
        "sentences": len(sentences),
        "sentence_chars": sum(map(len, sentences)),
        "model_sha256": hashlib.sha256(blob).hexdigest(),
        "model_bytes": len(blob),
        "read_seconds": round(read_s, 3),
        "seconds": round(time.perf_counter() - start, 3),
    }


def _write_atomically(path: str, blob: bytes) -> None:
    """Local paths: a unique hidden temp file + rename (a fixed `<path>.tmp-<pid>` could be a user's file);
    remote (s3://): one PUT, an atomic upload (transforms/io/io_utils.py publish_bytes)."""
    from transforms.io import io_utils  # noqa: PLC0415

    io_utils.publish_bytes(path, blob)
