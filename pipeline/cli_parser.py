"""`pileprep`'s command line as flags: every command, its options and their defaults (pipeline/cli.py runs them).

The shard options are derived from the config dataclasses (pipeline/config.py → pipeline/options.py); a
`--config FILE.toml` holds the same keys, and flags override it. Options pileprep does not know go to Beam
(`--runner=DataflowRunner --project ...`) only when Beam's option parser knows them after importing the
runner named by `--runner`; anything else, and any abbreviation, is exit 2 with a "did you mean".
`parse` returns the parsed options; `args.command` names the command (pipeline/cli.py `_commands` runs it).
"""
from __future__ import annotations

import argparse
import dataclasses
import re

from pipeline import options
from pipeline.config import PILEPREP_VERSION, RunOptions, ShardConfig, refuse
from pipeline.enabling_flags import orphan_option_problems
from pipeline.errors import UsageError
from pipeline.ops import runners


class HelpFormatter(argparse.HelpFormatter):
    """Shows each option's default (but not None / False / required ones, where it says nothing)."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if ("%(default)" not in text and action.option_strings and default is not None
                and default is not argparse.SUPPRESS and not isinstance(default, bool) and default not in ([], "")
                and not isinstance(action, argparse._CountAction)):  # noqa: SLF001
            shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else default
            text += f" (default: {shown})"
        return text


class Parser(argparse.ArgumentParser):
    """No abbreviations; errors raise UsageError (exit 2, one line) with a did-you-mean where one helps."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            choices = re.findall(r"'([^']*)'", m.group(2))
            hint = options.did_you_mean(m.group(1), choices)
            if message.startswith("argument COMMAND"):
                message = f"{self.prog}: unknown command {m.group(1)!r}{hint}; choose from {', '.join(choices)}"
            else:
                message += hint
        raise UsageError(message)


TYPED = "typed_options"  # the namespace attribute naming the options typed on the command line (dests)


def _typed(action_class: type) -> type:
    """`action_class` that also records its dest in `TYPED` when the option is on the command line: a value
    typed there is the user's request even when it equals the default (pipeline/config.py orphan options),
    unlike one from the defaults or a --config file (set_defaults, which no action sees)."""
    class Typed(action_class):
        def __call__(self, parser, namespace, values, option_string=None):
            super().__call__(parser, namespace, values, option_string)
            setattr(namespace, TYPED, getattr(namespace, TYPED, frozenset()) | {self.dest})

    return Typed


def count(text: str) -> int:
    """An argparse type for a number of things: an int of 0 or more (`inspect --examples -1` ran and exited 0)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _verbosity(parser: argparse.ArgumentParser, top: bool) -> None:
    """-v / -q, accepted before and after the subcommand (SUPPRESS: a subcommand does not reset the top's)."""
    g = parser.add_argument_group("output")
    g.add_argument("-v", "--verbose", action="count", default=0 if top else argparse.SUPPRESS,
                   help="more detail on stderr: pileprep's INFO logs (-vv: DEBUG, tracebacks)")
    g.add_argument("-q", "--quiet", action="store_true", default=False if top else argparse.SUPPRESS,
                   help="no progress, only errors")


def _subcommand(sub, name: str, help_text: str, beam_args: bool = False, path_errors: bool = True,
                **kw) -> argparse.ArgumentParser:
    """A subcommand with -v/-q. `path_errors`: a missing or unwritable path in this command names a path the
    user gave (inspect DIR, sample --output), so OSErrors about paths are user errors; in `shard` they can
    also come from the run itself (a vanished staging file), which is a failed run."""
    p = sub.add_parser(name, help=help_text, description=help_text, **kw)
    _verbosity(p, top=False)
    p.set_defaults(accepts_beam_args=beam_args, subparser=p, path_errors=path_errors)
    return p



def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pileprep", description="The Pile (or any JSON-lines corpus) -> tokenized, packed "
                                                 "TFRecord shards with a manifest, on Apache Beam.",
                    epilog="`pileprep COMMAND --help` lists a command's options and their defaults.")
    parser.add_argument("--version", action="version", version=f"pileprep {PILEPREP_VERSION}")
    _verbosity(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)

    shard = _subcommand(sub, "shard", "tokenize, pack and shard a corpus into TFRecords + manifest",
                        beam_args=True, path_errors=False,
                        epilog="Other options go to Apache Beam (--runner, --project, --temp_location, ...), see "
                               "README 'Running on Dataflow, Flink or Spark'.")
    shard.add_argument("--config", metavar="FILE.toml", default=None,
                       help="read options from a TOML file (keys are the option names, e.g. seq-len = 2048; "
                            "beam-args = [...] for Beam options); options on the command line override it")
    # the actions options.add_options makes (argparse's default store, store_true), recording what was typed
    for name, action_class in ((None, argparse._StoreAction), ("store", argparse._StoreAction),  # noqa: SLF001
                               ("store_true", argparse._StoreTrueAction)):  # noqa: SLF001
        shard.register("action", name, _typed(action_class))
    options.add_options(shard, ShardConfig)
    options.add_options(shard, RunOptions)
    # Not a ShardConfig field: the serialized config and fingerprint stay those of a run without it (SAME BYTES).
    shard.add_argument("--format", dest="formats", action="extend", nargs="+", default=None, metavar="FORMAT",
                       help="formats to write: tfrecord (always written: the shards are the source of truth), "
                            "megatron, hf, mds, parquet; several space or comma separated, or --format repeated. "
                            "Each other format is `pileprep export OUTPUT --format F` of the committed generation "
                            "into OUTPUT/F/ after the job commits (default: tfrecord)")

    sample = _subcommand(sub, "sample", "write the embedded Pile-format sample corpus")
    sample.add_argument("--output", required=True, help="directory to write the sample corpus to")
    sample.add_argument("--size-mb", type=float, default=24.0, metavar="N",
                        help="uncompressed size to write, in MB (10^6 bytes); past the installation's text, "
                             "marked copies of its documents fill the rest (the throughput benchmark's 96/384 MB)")
    sample.add_argument("--overwrite", action="store_true",
                        help="replace files in --output that an earlier `pileprep sample` did not write")

    tok = sub.add_parser("tokenizer", help="tokenizer tools", description="tokenizer tools")
    _verbosity(tok, top=False)
    tok_sub = tok.add_subparsers(dest="tokenizer_command", required=True, metavar="COMMAND", parser_class=Parser)
    train = _subcommand(tok_sub, "train",
                        "train a SentencePiece model (byte fallback) or an HF byte-level BPE on a corpus sample")
    train.add_argument("--input", nargs="+", required=True, metavar="GLOB", help="corpus files or globs")
    train.add_argument("--output", required=True, metavar="PATH", help="where to write the model (.model or .json)")
    train.add_argument("--vocab-size", type=int, default=8000, help="vocabulary size")
    train.add_argument("--kind", choices=("sentencepiece", "hf-bpe"), default="sentencepiece",
                       help="sentencepiece: a .model; hf-bpe: an HF byte-level BPE tokenizer.json (GPT-NeoX "
                            "settings) and a .tiktoken file of the same merges beside it")
    train.add_argument("--overwrite", action="store_true",
                       help="replace an existing --output (and, for hf-bpe, the .tiktoken file beside it)")

    s3_help = "For s3:// datasets, Beam's S3 options may follow: --s3_endpoint_url=URL --s3_region_name=NAME ..."
    inspect = _subcommand(sub, "inspect", "print a dataset's manifest summary and decode a few examples",
                          epilog=s3_help)
    inspect.add_argument("dataset", help="dataset directory or manifest.json (local or s3://)")
    inspect.add_argument("--examples", type=count, default=2, help="examples to decode")
    inspect.add_argument("--tokenizer", default=None, help="decode with this model (default: the manifest's)")
    inspect.add_argument("--json", action="store_true", help="machine-readable: the manifest and decoded examples")

    report = _subcommand(sub, "report", "write a self-contained HTML page (plots embedded) about a "
                         "dataset", epilog=s3_help)
    report.add_argument("dataset", help="dataset directory (local or s3://)")
    report.add_argument("--output", default=None, help="where to write the page (default DATASET/report.html)")
    report.add_argument("--metrics", default=None, metavar="FILE",
                        help="the trainer's metrics JSON lines (--metrics-file): adds loss and throughput curves")
    report.add_argument("--run-log", default=None, metavar="FILE",
                        help="the shard run's --run-log: adds its wall time to the headline")

    export = _subcommand(sub, "export", "write a dataset's shards in another format (Parquet, "
                         "Megatron .bin/.idx, HF datasets, MosaicML MDS)", epilog=s3_help)
    export.add_argument("dataset", help="dataset directory (local or s3://)")
    export.add_argument("--format", choices=["parquet", "megatron", "hf", "mds"], default="parquet",
                        help="output format: parquet; megatron (documents, <split>_text_document.bin/.idx); hf "
                        "(Parquet + dataset card for datasets.load_dataset); mds (MosaicML StreamingDataset)")
    export.add_argument("--output", default=None, help="output directory (default DATASET/FORMAT)")
    export.add_argument("--by-source", action="store_true",
                        help="megatron: one <split>_<source>_text_document.bin/.idx per source and blend.json, the "
                        "blend by each source's share of tokens (reads the dataset's inputs again)")
    export.add_argument("--break-lock", action="store_true", help="remove a gone run's lock on the export's output "
                        "first (as shard's --break-lock does on its output)")
    gc = _subcommand(sub, "gc", "remove a dataset's generations that nobody keeps (dry run unless --yes; "
                     "docs/OPERATIONS.md)", epilog=s3_help)
    gc.add_argument("dataset", help="dataset directory (local or s3://)")
    gc.add_argument("--yes", action="store_true", help="remove what the dry run lists (and refs whose holder is gone)")
    gc.add_argument("--keep-generations", type=int, default=1, metavar="N",
                    help="previous generations kept beside the live one, as `shard --keep-generations`")
    gc.add_argument("--break-lock", action="store_true", help="remove a gone run's lock on DATASET first")
    for p in (inspect, report, export, gc):
        p.set_defaults(filesystem_args=True)

    verify = _subcommand(sub, "verify",
                         "check every shard, dead letter and id index against the manifest (size, sha256); "
                         "with --inputs, audit a seeded sample of documents", beam_args=True,
                         epilog="Beam's filesystem options (--s3_endpoint_url, ...) reach s3:// datasets.")
    verify.add_argument("dataset", help="dataset directory (local, mounted or s3://bucket/prefix)")
    verify.add_argument("--inputs", nargs="+", default=None, metavar="GLOB",
                        help="the dataset's input files: re-read and re-tokenize a seeded sample of documents and "
                             "find each one in the shards (present once, token-exact, one split) or accounted for")
    verify.add_argument("--sample", type=int, default=200, help="documents to audit with --inputs")
    verify.add_argument("--seed", type=int, default=0, help="which documents the audit samples")
    verify.add_argument("--tokenizer", default=None, help="SentencePiece model (default: the manifest's)")

    env = _subcommand(sub, "env", "print versions and whether the C extensions (varint codec, word "
                      "shingles) are active")
    env.add_argument("--json", action="store_true", help="machine-readable output")

    help_text = "retrieval-context corpora: chunk database, index, neighbours (docs/RETRIEVAL.md)"
    retrieval = sub.add_parser("retrieval", help=help_text, description=help_text)
    _verbosity(retrieval, top=False)
    rsub = retrieval.add_subparsers(dest="retrieval_command", required=True, metavar="COMMAND", parser_class=Parser)
    from pipeline.retrieval.cli import add_parsers  # noqa: PLC0415 - argument definitions only, no Beam/Faiss

    add_parsers(lambda name, text: _subcommand(rsub, name, text, beam_args=name != "show"))
    return parser


def parse(argv: list, parser: argparse.ArgumentParser | None = None):
    """(args, beam_args): pileprep's options (with --config merged under them) and the checked Beam options."""
    parser = parser or build_parser()
    args, rest = parser.parse_known_args(argv)
    config_path = getattr(args, "config", None)
    if config_path:
        values, toml_beam_args = options.load_toml(config_path, (ShardConfig, RunOptions))
        args.subparser.set_defaults(**values)
        args, rest = parser.parse_known_args(argv)
        rest = toml_beam_args + rest
    if rest:
        sub = getattr(args, "subparser", parser)
        own = [o for a in sub._actions for o in a.option_strings]  # noqa: SLF001
        if getattr(args, "accepts_beam_args", False):
            # runner short names pileprep adds (--runner=DaskRunner) resolve before Beam's parser sees them
            rest = options.check_beam_args(runners.normalise_beam_args(rest), own)
        elif getattr(args, "filesystem_args", False) and all(r.startswith("--s3_") and "=" in r for r in rest):
            pass  # Beam's S3 options (--s3_endpoint_url=...) for an s3:// dataset: inspect, report, export
        else:
            flagged = [r for r in rest if r.startswith("-")]
            bad = (flagged or rest)[0].split("=", 1)[0]
            raise UsageError(f"{sub.prog}: unrecognized argument {bad}{options.did_you_mean(bad, own)}")
    if args.command == "shard":  # what was typed is known only here; the values' own checks: ShardConfig.validate
        refuse(orphan_option_problems(vars(args), dataclasses.fields(ShardConfig) + dataclasses.fields(RunOptions),
                                     getattr(args, TYPED, frozenset())))
    return args, rest
