"""The shard job's configuration: one typed place, validated before any work starts.

A bad configuration fails fast with a message that names the knob (`--seq-len`, `--input`, `--tokenizer`);
bad *data* never fails the run (it is filtered or dead-lettered instead).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from pipeline.enabling_flags import orphan_option_problems
from pipeline.errors import ConfigError
from pipeline.shard.near_dedup.settings import DecontaminateConfig, NearDedupConfig
from transforms.shard import best_fit
from transforms.shard import decontaminate as decontaminate_mod
from transforms.shard import mixture
from transforms.shard.near_dedup import clusters, minhash, shingling
from transforms.shard.documents import SPLITS

PILEPREP_VERSION = "0.1.0"  # equals [project].version in pyproject.toml (tests/unit/tools/test_install.py checks)
BYTES_PER_TOKEN_ESTIMATE = 6.0  # serialized int64 varints of 3 features + framing, measured on the sample
DEFAULT_HOLDOUT_FRACTION = 0.01  # val and test share of train inputs when no held-out files are given
# Packing holds one example at a time: 3 int64 features, their serialized form and the framed record, measured
# at 86 bytes per token (tracemalloc, seq_len 262144). The upper bound keeps one example under ~100 MiB, so a
# typo (`--seq-len 1000000000`) fails before any work instead of growing until the kernel kills the job.
EXAMPLE_BYTES_PER_TOKEN = 96
MAX_SEQ_LEN = 1 << 20
ZSTD_MAX_WINDOW_MB = 2048  # zstd's own limit (window log 31)
_NEAR = "near-duplicates and decontamination (docs/NEAR_DEDUP.md)"


def option(default=dataclasses.MISSING, help: str = "", *, flag: Optional[str] = None,  # noqa: A002
           metavar: Optional[str] = None, group: Optional[str] = None, exclusive: Optional[str] = None,
           manifest: bool = True, cli: bool = True, short: Optional[str] = None):
    """A config field and its command-line option in one place (pipeline/options.py derives the CLI from it).

    `flag`: the option name when it is not `--field-name` (e.g. `inputs` is `--input`); `group`: the help
    section; `exclusive`: options sharing this name are mutually exclusive; `manifest=False`: the field says
    where or how the job runs, not what the data is, so it stays out of the manifest and the fingerprint;
    `cli=False`: not an option at all.
    """
    metadata = {"help": help, "flag": flag, "metavar": metavar, "group": group, "exclusive": exclusive,
                "manifest": manifest, "cli": cli, "short": short}
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def _literal_choices(cls) -> dict:
    """{field: its allowed values} for the dataclass fields typed Literal[...], so a check never repeats them."""
    hints = typing.get_type_hints(cls)
    return {f.name: typing.get_args(hints[f.name]) for f in dataclasses.fields(cls)
            if typing.get_origin(hints[f.name]) is Literal}


@dataclass(frozen=True)
class ShardConfig:
    """What the shard job makes: every field is a `pileprep shard` option and a `--config` TOML key."""
    inputs: tuple[str, ...] = option(
        help="input files or globs (.jsonl, .jsonl.zst, .jsonl.gz, .json.gz, .parquet; local, mounted or s3://)",
        flag="--input", metavar="GLOB")
    output: str = option(help="dataset directory (local, EFS/FSx mount, or s3://bucket/prefix)", manifest=False,
                         metavar="DIR")
    tokenizer: str = option(help="tokenizer file, format read from its content: SentencePiece .model, HF "
                            "tokenizer.json (or a directory holding one), tiktoken BPE file", metavar="PATH")
    tokenizer_pattern: str = option("", "tiktoken file's split pattern: gpt2, cl100k, o200k or a regex",
                                    metavar="NAME|REGEX")
    special_tokens: str = option("", "tiktoken file's special tokens: 'TEXT=ID,...' or a JSON object",
                                 metavar="SPEC")
    # None = not given (the tokenizer's single obvious EOS); "" given is refused in validate, not read as absent
    eos_token: Optional[str] = option(None, "the token that ends every document (required when the tokenizer has no "
                                      "single obvious one, e.g. '<|endoftext|>')", metavar="TEXT")
    seq_len: int = option(2048, "tokens per example")
    num_shards: Optional[int] = option(None, "train shards (val/test get a proportional count, at least 1)",
                                       exclusive="size", metavar="N")
    target_shard_mb: float = option(1024.0, "target shard size in MiB, used when --num-shards is not given",
                                    exclusive="size", metavar="MB")
    # None: 0.01 each, or 0 when --val-input/--test-input name the held-out files (resolved in __post_init__)
    val_fraction: Optional[float] = option(
        None, "fraction of train-input documents (by id hash) that go to the val split (default 0.01, or 0 with "
        "--val-input/--test-input)")
    test_fraction: Optional[float] = option(
        None, "fraction of train-input documents (by id hash) that go to the test split (default 0.01, or 0 with "
        "--val-input/--test-input)")
    seed: int = option(0, "seed of the split hash and of packing order")
    text_field: str = option("text", "JSON field or Parquet column with the text (dotted path)", metavar="FIELD")
    source_fields: tuple[str, ...] = option(
        ("meta.pile_set_name",), "fields naming the document's source, first present wins (e.g. 'source' for "
        "Dolma)", flag="--source-field", metavar="FIELD")
    unit_mb: float = option(32.0, "raw text per tokenization work unit (the parallelism grain)", metavar="MB")
    max_line_mb: float = option(
        56.0, "longer input lines are dead-lettered (line_too_long); bounds reader and tokenizer memory: long "
        "documents tokenize in exact pieces, and a worst-case document at the limit (one token per byte, with a "
        "token-less run at --max-pretoken-mb) peaked at 1.25 GB in one worker (bench/memory_bench.py; 64 MB: 1.57 "
        "GB, over the 1.5 GB per-worker bound)",
        metavar="MB")
    max_pretoken_mb: float = option(
        16.0, "a long document is tokenized in exact pieces cut at spaces before words; a stretch of more than "
        "this many MB of UTF-8 without one is dead-lettered (pretoken_too_long)", metavar="MB")
    max_zstd_window_mb: float = option(
        512.0, "largest zstd decompression window read (held in memory while a file is read; `zstd --long=N` "
        "files need 2^N bytes); files that need more are dead-lettered (zstd_window_too_large)", metavar="MB")
    staging_dir: Optional[str] = option(None, "where spill files and worker logs go (default <output>/_staging)",
                                        manifest=False, metavar="DIR")
    val_inputs: tuple[str, ...] = option(
        (), "files or globs that go wholly to val (e.g. the Pile's val.jsonl.zst); held-out copies win over "
        "train", flag="--val-input", metavar="GLOB")
    test_inputs: tuple[str, ...] = option(
        (), "files or globs that go wholly to test (e.g. the Pile's test.jsonl.zst); held-out copies win over "
        "train", flag="--test-input", metavar="GLOB")
    source_weights: str = option(
        "", "mixture weights as epochs per source: 'Pile-CC=1,Wikipedia (en)=3', the preset 'pile' (the Pile "
        "paper's epochs), or both ('pile,Github=0.5'); unlisted sources weigh 1; train split only "
        "(transforms/shard/mixture.py)", metavar="SPEC")
    # Near-duplicates and decontamination (docs/NEAR_DEDUP.md, pipeline/shard/near_dedup/); off by default.
    near_dedup: bool = option(
        False, "remove near-duplicate documents: MinHash LSH over word 5-grams (or token n-grams: "
        "--near-dedup-shingles), one keeper per cluster (test over val over train, then the smallest id), removed "
        "ones filtered near_duplicate with their keeper recorded",
        group=_NEAR)
    near_dedup_bands: int = option(minhash.DEFAULT_BANDS, "LSH bands (permutations = bands x rows); with the "
                                   "default rows: " + minhash.s_curve_text(minhash.DEFAULT_BANDS,
                                                                           minhash.DEFAULT_ROWS),
                                   group=_NEAR, metavar="N")
    near_dedup_rows: int = option(minhash.DEFAULT_ROWS, "MinHash values per band", group=_NEAR, metavar="N")
    near_dedup_threshold: float = option(
        minhash.DEFAULT_THRESHOLD, "a candidate pair is a near-duplicate when its estimated Jaccard "
        "similarity (exact with --near-dedup-verify) reaches this", group=_NEAR, metavar="J")
    near_dedup_verify: bool = option(False, "check each candidate pair by the exact Jaccard of its shingles",
                                     group=_NEAR)
    near_dedup_shingles: Literal["words", "tokens"] = option(
        shingling.DEFAULT_SHINGLES, "what near-dedup's Jaccard is over: words = word 5-grams of the lower-cased "
        "text (case, spacing and punctuation ignored); tokens = token " + str(shingling.SHINGLE_TOKENS) +
        "-grams of the tokenizer's ids (no second read of the text; copies that differ in case or "
        "spacing tokenize differently and are missed, docs/NEAR_DEDUP.md); an incremental run must use the "
        "committed dataset's", group=_NEAR)
    near_dedup_rounds: int = option(clusters.DEFAULT_ROUNDS, "union-find (label propagation) rounds in the "
                                    "graph; a cluster farther than this from its keeper fails the run (exit 1)",
                                    group=_NEAR, metavar="N")
    decontaminate: tuple[str, ...] = option(
        (), "evaluation sets (jsonl[.zst|.gz] or parquet files or globs): train documents sharing a word n-gram "
        "with an evaluation text are filtered contaminated (eval file and n-gram recorded)", group=_NEAR,
        metavar="GLOB")
    decontaminate_field: str = option("text", "text field (dotted path) or column of the evaluation files",
                                      group=_NEAR, metavar="FIELD")
    decontaminate_ngram: int = option(decontaminate_mod.DEFAULT_NGRAM, "words per n-gram (lower case, "
                                      "punctuation stripped)", group=_NEAR, metavar="N")
    decontaminate_held_out: bool = option(False, "check val/test documents against the evaluation sets too",
                                          group=_NEAR)
    # Packing (transforms/shard/packing.py, transforms/shard/best_fit.py): absent from the manifest's config at the
    # default, so datasets built before the option keep their bytes and generation names.
    packing: Literal["concat", "best-fit"] = option(
        "concat", "how documents become examples of --seq-len tokens: concat = laid end to end and cut every "
        "--seq-len tokens (a document that straddles a cut is split); best-fit = documents longer than --seq-len "
        "cut into full-length pieces, the rest placed whole by best-fit decreasing, so a document that fits is "
        "never split (padding per example; transforms/shard/best_fit.py)")
    packing_window: int = option(
        best_fit.DEFAULT_WINDOW_EXAMPLES, "with --packing best-fit: the bin-packing window, in examples' worth of "
        "tokens buffered per packer: larger packs tighter (less padding) and holds more tokens in memory",
        metavar="EXAMPLES")
    # How the job ran, not what it made: not in the manifest's config, not in the fingerprint.
    allow_unknown_sources: bool = option(
        False, "run even when a source named in --source-weights appears in no sampled record (it is then only "
        "warned about); without it that is a configuration error naming the sources seen", manifest=False)
    tokenizer_backend: Literal["auto", "reference", "sentencepiece", "gigatoken", "kitoken", "splintr"] = option(
        "auto", "exact fast tokenizer path: auto tries the fast backends (gigatoken, splintr, kitoken) after id-for-"
        "id parity with the format's reference library on the run's sample; reference = that library "
        "(transforms/tokenize/tokenizer_backends.py)", manifest=False)
    shuffle: Literal["auto", "files", "runner"] = option(
        "auto", "how tokenized documents reach their shard (docs/SHUFFLE.md): files = pack tasks read ranges of "
        "every unit's spill files; runner = the runner's GroupByKey moves per-shard pieces; auto = runner on every "
        "runner whose GroupByKey is distributed (Dataflow, Flink, Spark, Dask, PortableRunner), files on the local "
        "FnApiRunner/DirectRunner/Prism (they hold a GroupByKey in memory). Same bytes either way", manifest=False)
    # Operations (docs/OPERATIONS.md §3): how a run guards the output, not what it makes.
    break_lock: bool = option(
        False, "remove another run's lock on --output first (only when that run is known to be gone; a crashed "
        "run's lock goes stale by itself after 120 s)", manifest=False, group="operations (docs/OPERATIONS.md)")
    overwrite: bool = option(
        False, "replace a committed dataset made with another configuration (seq_len, tokenizer, ...); without "
        "it such a run exits 2 naming what differs", manifest=False, group="operations (docs/OPERATIONS.md)")
    no_resume: bool = option(
        False, "start afresh: discard the staging a killed run of the same config and inputs left, instead of "
        "reusing its finished units (resuming is the default; docs/OPERATIONS.md)", manifest=False,
        group="operations (docs/OPERATIONS.md)")
    keep_generations: int = option(
        1, "previous generations a commit keeps beside the live one (a trainer reading the old manifest keeps its "
        "files); older ones go at the next commit or with `pileprep gc`, never one a ref in .refs/ names",
        manifest=False, metavar="N", group="operations (docs/OPERATIONS.md)")
    max_dead_letter_fraction: float = option(
        0.5, "fail without committing when more than this fraction of the records read are dead-lettered "
        "(checked once at least 1,000 records were read)", manifest=False, metavar="FRACTION",
        group="operations (docs/OPERATIONS.md)")
    # free-form settings no option names (not a flag, not in the manifest): heterogeneous JSON. options.py skips
    # it (cli=False) but get_type_hints still evaluates it, hence `Any` imported at runtime.
    extra: dict[str, Any] = option({}, cli=False, manifest=False)

    def __post_init__(self):
        held_out_files = bool(self.val_inputs or self.test_inputs)
        for name in ("val_fraction", "test_fraction"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, 0.0 if held_out_files else DEFAULT_HOLDOUT_FRACTION)
        object.__setattr__(self, "val_inputs", tuple(self.val_inputs))
        object.__setattr__(self, "test_inputs", tuple(self.test_inputs))

    def validate(self) -> None:
        problems = []
        if not self.inputs:
            problems.append("--input: give at least one path or glob")
        if not self.output:
            problems.append("--output: give an output directory")
        if self.seq_len < 2:
            problems.append(f"--seq-len must be at least 2, got {self.seq_len}")
        elif self.seq_len > MAX_SEQ_LEN:
            problems.append(f"--seq-len {self.seq_len} is above the limit {MAX_SEQ_LEN}: one example needs about "
                            f"{EXAMPLE_BYTES_PER_TOKEN} bytes per token in memory while it is packed "
                            f"({self.seq_len * EXAMPLE_BYTES_PER_TOKEN / (1 << 30):.1f} GiB)")
        if self.num_shards is not None and self.num_shards < 1:
            problems.append(f"--num-shards must be at least 1, got {self.num_shards}")
        if self.target_shard_mb <= 0:
            problems.append(f"--target-shard-mb must be positive, got {self.target_shard_mb}")
        elif self.num_shards is not None and self.target_shard_mb != type(self).__dataclass_fields__["target_shard_mb"].default:
            # on the command line argparse refuses the pair; from a --config file the size was silently ignored
            problems.append("--num-shards and --target-shard-mb: give one (the shard count or the shard size)")
        for name, value in (("--val-fraction", self.val_fraction), ("--test-fraction", self.test_fraction)):
            if not 0.0 <= value < 1.0:
                problems.append(f"{name} must be in [0, 1), got {value}")
        if self.val_fraction + self.test_fraction >= 1.0:
            problems.append("--val-fraction + --test-fraction must leave something for train")
        for name, choices in _literal_choices(type(self)).items():  # the allowed values are the type's own
            value = getattr(self, name)
            if value not in choices:
                problems.append(f"--{name.replace('_', '-')} must be {', '.join(choices[:-1])} or {choices[-1]}, "
                                f"got {value!r}")
        if self.packing_window < 1:
            problems.append(f"--packing-window must be at least 1, got {self.packing_window}")
        problems += orphan_option_problems(vars(self), dataclasses.fields(self))
        if self.keep_generations < 0:
            problems.append(f"--keep-generations must be 0 or more, got {self.keep_generations}")
        if self.eos_token == "":  # `--eos-token ''` (an unset shell variable) must not silently mean "pick one"
            problems.append("--eos-token is empty: give the text of the end-of-document token (e.g. "
                            "'<|endoftext|>') or leave the option out")
        if not 0.0 <= self.max_dead_letter_fraction <= 1.0:
            problems.append(f"--max-dead-letter-fraction must be in [0, 1], got {self.max_dead_letter_fraction}")
        if self.unit_mb <= 0 or self.max_line_mb <= 0 or self.max_pretoken_mb <= 0:
            problems.append("--unit-mb, --max-line-mb and --max-pretoken-mb must be positive")
        if not 0 < self.max_zstd_window_mb <= ZSTD_MAX_WINDOW_MB:
            problems.append(f"--max-zstd-window-mb must be in (0, {ZSTD_MAX_WINDOW_MB}] (zstd's largest window), "
                            f"got {self.max_zstd_window_mb}")
        try:
            self.mixture_weights
        except ConfigError as e:
            problems.append(str(e))
        problems += near_dedup_problems(self)
        refuse(problems)

    @property
    def near_dedup_config(self) -> NearDedupConfig:
        """The `near_dedup*` fields as one typed record (the flat fields are the options and the fingerprint)."""
        return NearDedupConfig.of(self)

    @property
    def decontaminate_config(self) -> DecontaminateConfig:
        """The `decontaminate*` fields as one typed record."""
        return DecontaminateConfig.of(self)

    @property
    def mixture_weights(self) -> dict:
        """The parsed `--source-weights`; a bad spec is a ConfigError naming the option (exit 2), wherever it is
        first read: the job's start event (pipeline/shard/shard_pipeline.py describe) reads it before preflight."""
        try:
            return mixture.parse_weights(self.source_weights) if self.source_weights else {}
        except ValueError as e:
            raise ConfigError(f"--source-weights: {e}") from None

    @property
    def unit_bytes(self) -> int:
        return int(self.unit_mb * (1 << 20))

    @property
    def max_line_bytes(self) -> int:
        return int(self.max_line_mb * (1 << 20))

    @property
    def max_zstd_window_bytes(self) -> int:
        return int(self.max_zstd_window_mb * (1 << 20))

    def to_manifest_dict(self) -> dict:
        """What goes into the manifest: everything that shapes the data, nothing about where or how it ran."""
        d = dataclasses.asdict(self)
        for f in dataclasses.fields(self):
            if not f.metadata.get("manifest", True):
                d.pop(f.name)
        d["inputs"] = list(self.inputs)
        for key in ("val_inputs", "test_inputs"):  # absent when unused, like source_weights
            if getattr(self, key):
                d[key] = list(getattr(self, key))
            else:
                d.pop(key)
        d["source_fields"] = list(self.source_fields)
        d["splits"] = list(SPLITS)
        for key in ("tokenizer_pattern", "special_tokens", "eos_token"):  # absent when unused, as source_weights
            if not d[key]:
                d.pop(key)
        for prefix, used in (("near_dedup", self.near_dedup), ("decontaminate", bool(self.decontaminate))):
            for key in [k for k in d if k.startswith(prefix)]:  # absent when unused (generation names stay)
                if used:
                    d[key] = list(d[key]) if isinstance(d[key], tuple) else d[key]
                else:
                    d.pop(key)
        if d.get("near_dedup_shingles") == shingling.DEFAULT_SHINGLES:  # absent at its default, so datasets
            d.pop("near_dedup_shingles")  # built before the option keep their names (generation = fingerprint)
        if self.packing == "concat":  # absent at the default, so datasets built before the option keep their names
            d.pop("packing")
            d.pop("packing_window")
        if not self.source_weights:  # absent when unused, so datasets built before the option keep their names
            d.pop("source_weights")
        else:
            d["source_weights"] = self.mixture_weights
        return d


def refuse(problems: list) -> None:
    """A ConfigError listing every problem (the CLI prints it in one line, exit 2), or nothing when none."""
    if problems:
        raise ConfigError("invalid shard configuration:\n  " + "\n  ".join(problems))


def near_dedup_problems(c: "ShardConfig") -> list:
    near, decon = c.near_dedup_config, c.decontaminate_config
    counts = (("--near-dedup-bands", near.bands), ("--near-dedup-rows", near.rows),
              ("--near-dedup-rounds", near.rounds), ("--decontaminate-ngram", decon.ngram))
    problems = [f"{flag} must be at least 1, got {value}" for flag, value in counts if value < 1]
    if not 0.0 < near.threshold <= 1.0:
        problems.append(f"--near-dedup-threshold must be in (0, 1], got {near.threshold}")
    return problems


def fingerprint(config: ShardConfig, tokenizer_sha256: str, inputs: list, parents=()) -> str:
    """Identity of a dataset generation: config + tokenizer + input ledger (`inputs`: (path, size) pairs), and
    for a generation that builds on committed ones (incremental), the names of those parents, so that it can
    never share a name (and a directory) with a full build over the same files."""
    identity = {"config": config.to_manifest_dict(), "tokenizer": tokenizer_sha256, "inputs": inputs,
                "version": PILEPREP_VERSION}
    if parents:
        identity["parents"] = sorted(parents)
    blob = json.dumps(identity, sort_keys=True)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class RunOptions:
    """How `pileprep shard` runs (not what it makes): options, never in the manifest or the fingerprint."""
    incremental: bool = option(False, "add only input files the dataset does not hold yet, as a new generation; "
                                      "changed or removed inputs are an error; nothing new = nothing to do",
                               group="operations (docs/OPERATIONS.md)", manifest=False)
    run_log: Optional[str] = option(None, "append a JSON-lines run log (start, plan, progress, committed, summary, "
                                          "error)", group="operations (docs/OPERATIONS.md)", metavar="PATH",
                                    manifest=False)
    progress_every: Optional[float] = option(
        None, "progress period in seconds: docs/s, tokens/s, MB/s, ETA, dead letters (default: 1 on a terminal, "
              "10 otherwise; 0 = off)", group="operations (docs/OPERATIONS.md)", metavar="SECONDS",
        manifest=False)
    dry_run: bool = option(False, "estimate files, bytes, tokens, examples, shards, output bytes and core-hours "
                                  "from a sample of the inputs; write nothing", group="operations (docs/OPERATIONS.md)",
                           manifest=False)
    dry_run_workers: Optional[int] = option(
        None, "with --dry-run: the worker cores to estimate wall time for (default: this machine's cores)",
        group="operations (docs/OPERATIONS.md)", metavar="N", manifest=False)
