"""Every check the shard job makes before it takes the lock, each made once: the configuration, the runner's
endpoints, the object stores, the staging directory's placement, the local paths' writability and
--decontaminate's evaluation files.

All of them fail with a ConfigError (exit 2, one line naming the option) in seconds, before any input is read.
What needs the lock (the committed manifest, leftovers of crashed runs) is the job runner's (pipeline/job.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.beam_glue import FilesystemOptions, s3_options_of
from pipeline.config import ShardConfig
from pipeline.errors import ConfigError, RunError
from pipeline.ops import commit, guards, runners, storage
from transforms.io import io_utils


@dataclass(frozen=True)
class Checked:
    """What the preflight established: the filesystem options the plan carries to workers."""
    filesystem_options: Optional[FilesystemOptions]

    @property
    def s3_options(self) -> dict:
        return s3_options_of(self.filesystem_options)


def check_config(config: ShardConfig) -> None:
    """The configuration on its own: option values, and where staging may live relative to the output."""
    config.validate()
    check_tokenizer_options(config)
    commit.check_staging_dir(config.output, config.staging_dir)


def check_tokenizer_options(config: ShardConfig) -> None:
    """--tokenizer-pattern, --special-tokens and --eos-token on their own, before the file is read: a pattern that
    matches the empty string or leaves text unmatched, a repeated text or id, a padded text (TokenizerError, exit
    2). What needs the file (an EOS that is an ordinary piece, an id taken by the file) is checked when it loads
    (transforms/tokenize/formats.py)."""
    from transforms.tokenize import formats, tokenizer  # noqa: PLC0415 - keep the preflight light to import

    options = tokenizer.options_of(config)
    if options.pattern:
        formats.tiktoken_pattern(options.pattern)
    formats.parse_special_tokens(options.special_tokens)
    if options.eos_token and options.eos_token != options.eos_token.strip():
        raise formats.TokenizerError(f"--eos-token {options.eos_token[:40]!r} has leading or trailing whitespace")


def check_environment(config: ShardConfig, options: PipelineOptions) -> Checked:
    """The runner's endpoints, the object stores the job reads and writes, and local writability."""
    runners.preflight(options.get_all_options())
    fs_options = FilesystemOptions.from_pipeline_options(options)
    storage.preflight(config.inputs, config.output, config.staging_dir, s3_options_of(fs_options))
    guards.check_local_writable(config.output, "--output")
    guards.check_local_writable(config.staging_dir, "--staging-dir")
    return Checked(fs_options)


def check_decontaminate(config: ShardConfig) -> None:
    """--decontaminate's evaluation files, read once here with the stage's own reader
    (pipeline/shard/near_dedup/eval_sets.py): each match a regular file whose bytes are the compression its name
    says, every record JSON, and at least one record with a string --decontaminate-field. Otherwise the stage
    would fail in a worker after every document was tokenized (exit 1), or remove nothing without a word.
    The files are evaluation sets (small next to the corpus); every worker reads them again to build its set."""
    if not config.decontaminate:
        return
    from pipeline.ops import input_checks  # noqa: PLC0415
    from pipeline.shard.near_dedup import eval_sets  # noqa: PLC0415 - the stage's reader, so both accept the same

    files = eval_sets.eval_files(config)  # ConfigError for a glob that matches nothing
    kept, skipped = input_checks.screen_inputs([{"path": p} for p in files], config.output, "")
    if skipped:
        path, reason = skipped[0]["path"], skipped[0]["reason"]
        hint = (f"a directory: name its files (e.g. {path.rstrip('/')}/*.jsonl)" if io_utils.is_local(path)
                and os.path.isdir(path) else reason.replace("_", " "))
        raise ConfigError(f"--decontaminate: {path} is {hint}")
    input_checks.check_compression(kept, "--decontaminate")
    field = config.decontaminate_field
    for path in files:
        try:
            texts = sum(1 for _ in eval_sets.eval_texts(path, field))
        except (ValueError, RunError, OSError) as e:  # a line that is not JSON, a damaged file
            message = str(e).removeprefix("--decontaminate: ")
            raise ConfigError(f"--decontaminate: {message}; an evaluation file is JSON lines (or Parquet) with "
                              f"a --decontaminate-field {field!r}") from None
        if not texts:
            raise ConfigError(f"--decontaminate: {path} has no record with a string field {field!r}; name the "
                              "evaluation text's field with --decontaminate-field (a dotted path)")


def check(config: ShardConfig, options: PipelineOptions) -> Checked:
    """Every check, in the order that reports the cheapest mistake first."""
    check_config(config)
    checked = check_environment(config, options)
    check_decontaminate(config)  # reads the evaluation files: after the object stores are known to answer
    return checked
