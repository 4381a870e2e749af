"""Every check the shard job makes before it takes the lock, each made once: the configuration, the runner's
endpoints, the object stores, the staging directory's placement and the local paths' writability.

All of them fail with a ConfigError (exit 2, one line naming the option) in seconds, before any input is read.
What needs the lock (the committed manifest, leftovers of crashed runs) is the job runner's (pipeline/job.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.beam_glue import FilesystemOptions, s3_options_of
from pipeline.config import ShardConfig
from pipeline.ops import commit, guards, runners, storage


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


def check(config: ShardConfig, options: PipelineOptions) -> Checked:
    """Every check, in the order that reports the cheapest mistake first."""
    check_config(config)
    return check_environment(config, options)
