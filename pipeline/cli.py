"""`pileprep` command line: shard, sample, tokenizer train, inspect.

Options pileprep does not know are handed to Beam unchanged (`--runner=DataflowRunner --project ...`), so the
same command runs locally or on Dataflow / Flink / Spark.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys

from pipeline.config import ConfigError, RunError, RunInterrupted, ShardConfig


def _add_shard_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", nargs="+", required=True, metavar="GLOB",
                   help="input files or globs (.jsonl, .jsonl.zst, .jsonl.gz, .json.gz; local, mounted or s3://)")
    p.add_argument("--output", required=True, help="dataset directory (local, EFS/FSx mount, or s3://bucket/prefix)")
    p.add_argument("--tokenizer", required=True, help="SentencePiece .model file")
    p.add_argument("--seq-len", type=int, default=2048)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--num-shards", type=int, default=None, help="train shards (val/test proportional)")
    size.add_argument("--target-shard-mb", type=float, default=1024.0, help="target shard size (default 1 GiB)")
    p.add_argument("--val-fraction", type=float, default=0.01)
    p.add_argument("--test-fraction", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text-field", default="text", help="JSON field with the text (dotted path)")
    p.add_argument("--source-field", nargs="+", default=["meta.pile_set_name"], dest="source_fields",
                   help="fields naming the document's source, first present wins (e.g. 'source' for Dolma)")
    p.add_argument("--unit-mb", type=float, default=32.0, help="raw text per tokenization work unit")
    p.add_argument("--max-line-mb", type=float, default=256.0, help="longer lines are dead-lettered")
    p.add_argument("--staging-dir", default=None, help="where spill files go (default <output>/_staging)")
    p.add_argument("--break-lock", action="store_true", help=_help("break_lock"))
    p.add_argument("--max-dead-letter-fraction", type=float, default=0.5, help=_help("max_dead_letter_fraction"))
    ops = p.add_argument_group("operations (docs/OPERATIONS.md)")
    ops.add_argument("--incremental", action="store_true",
                     help="add only input files the dataset does not hold yet, as a new generation; changed or "
                          "removed inputs are an error; nothing new = nothing to do")
    ops.add_argument("--run-log", default=None, metavar="PATH",
                     help="append a JSON-lines run log (start, plan, progress, committed, summary, error)")
    ops.add_argument("--progress-every", type=float, default=10.0, metavar="SECONDS",
                     help="progress line period: docs/s, tokens/s, MB/s, ETA (0 = off)")


def _shard_config(args) -> ShardConfig:
    return ShardConfig(inputs=tuple(args.input), output=args.output, tokenizer=args.tokenizer,
                       seq_len=args.seq_len, num_shards=args.num_shards, target_shard_mb=args.target_shard_mb,
                       val_fraction=args.val_fraction, test_fraction=args.test_fraction, seed=args.seed,
                       text_field=args.text_field, source_fields=tuple(args.source_fields), unit_mb=args.unit_mb,
                       max_line_mb=args.max_line_mb, staging_dir=args.staging_dir, break_lock=args.break_lock,
                       max_dead_letter_fraction=args.max_dead_letter_fraction)


def _help(name: str) -> str:
    return ShardConfig.__dataclass_fields__[name].metadata["help"]


def cmd_shard(args, beam_args) -> int:
    from pipeline.shard import shard_pipeline  # noqa: PLC0415 - Beam import only for commands that need it
    from pipeline.tools.inspect_dataset import summary_table  # noqa: PLC0415

    manifest = shard_pipeline.run(_shard_config(args), beam_args, incremental_run=args.incremental,
                                  run_log=args.run_log, progress_every_s=args.progress_every)
    print(summary_table(manifest))
    return 0


def cmd_sample(args, _beam_args) -> int:
    from pipeline.tools.sample_corpus import write_sample_corpus  # noqa: PLC0415

    print(json.dumps(write_sample_corpus(args.output), indent=1, sort_keys=True))
    return 0


def cmd_tokenizer_train(args, _beam_args) -> int:
    from pipeline.tools.tokenizer_train import train_tokenizer  # noqa: PLC0415

    print(json.dumps(train_tokenizer(args.input, args.output, args.vocab_size), indent=1, sort_keys=True))
    return 0


def cmd_inspect(args, _beam_args) -> int:
    from pipeline.tools.inspect_dataset import inspect  # noqa: PLC0415

    print(inspect(args.dataset, examples=args.examples, tokenizer_path=args.tokenizer))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pileprep", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)
    shard = sub.add_parser("shard", help="tokenize, pack and shard a corpus into TFRecords + manifest")
    _add_shard_args(shard)
    shard.set_defaults(func=cmd_shard)
    sample = sub.add_parser("sample", help="write the embedded Pile-format sample corpus")
    sample.add_argument("--output", required=True)
    sample.set_defaults(func=cmd_sample)
    tok = sub.add_parser("tokenizer", help="tokenizer tools")
    tok_sub = tok.add_subparsers(dest="tokenizer_command", required=True)
    train = tok_sub.add_parser("train", help="train a SentencePiece model (byte fallback) on a corpus sample")
    train.add_argument("--input", nargs="+", required=True, metavar="GLOB")
    train.add_argument("--output", required=True, help="PATH.model")
    train.add_argument("--vocab-size", type=int, default=8000)
    train.set_defaults(func=cmd_tokenizer_train)
    inspect = sub.add_parser("inspect", help="print a dataset's manifest summary and decode a few examples")
    inspect.add_argument("dataset", help="dataset directory or manifest.json")
    inspect.add_argument("--examples", type=int, default=2)
    inspect.add_argument("--tokenizer", default=None, help="decode with this model (default: the manifest's)")
    inspect.set_defaults(func=cmd_inspect)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args, beam_args = parser.parse_known_args(argv)
    if beam_args and args.command != "shard":
        parser.error(f"unrecognized arguments: {' '.join(beam_args)}")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from pipeline.ops.redaction import OneLineFrameworkErrors, RedactingFilter, redact_userinfo  # noqa: PLC0415

    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactingFilter())
        if not args.verbose:
            handler.addFilter(OneLineFrameworkErrors())
    try:
        return args.func(args, beam_args)
    except ConfigError as e:
        print(f"pileprep: {redact_userinfo(str(e))}", file=sys.stderr)
        return 2
    except RunError as e:
        print(f"pileprep: run failed: {redact_userinfo(str(e))}", file=sys.stderr)
        return 1
    except (RunInterrupted, KeyboardInterrupt) as e:
        print("pileprep: interrupted; previous dataset intact", file=sys.stderr, flush=True)
        return e.exit_code if isinstance(e, RunInterrupted) else 130
    except (FileNotFoundError, ValueError) as e:
        if type(e).__name__ in ("TokenizerError", "FileNotFoundError", "ContractError"):
            print(f"pileprep: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
