"""`pileprep` command line: shard, sample, tokenizer train, inspect, env.

The shard options are derived from the config dataclasses (pipeline/config.py → pipeline/options.py); a
`--config FILE.toml` holds the same keys, and flags override it. Options pileprep does not know go to Beam
(`--runner=DataflowRunner --project ...`) only when Beam's option parser knows them after importing the
runner named by `--runner`; anything else, and any abbreviation, is exit 2 with a "did you mean".

Exit codes: 0 done, 1 the run failed, 2 a user error (pipeline/errors.py: one line naming what to change).
Only this module prints; stdout gets results (summary tables, JSON), stderr gets progress and messages.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import traceback

from pipeline import options
from pipeline.ops import runners
from pipeline.config import PILEPREP_VERSION, RunOptions, ShardConfig
from pipeline.errors import RunError, RunInterrupted, UsageError, is_user_error, one_line
from pipeline.output import print_outcome
from pipeline.ops.redaction import RedactingFilter, SinkFormatter, install_sink_formatters, redact_userinfo
from pipeline.ops.safe_text import terminal

LOG = logging.getLogger("pileprep")


class RunFailed(Exception):
    """A run failed (not a user error): carries the worker log's tail and where the log is kept."""

    def __init__(self, cause: BaseException, tail: list, log_path):
        super().__init__(str(cause))
        self.tail = tail
        self.log_path = log_path
        self.__cause__ = cause


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


def _verbosity(parser: argparse.ArgumentParser, top: bool) -> None:
    """-v / -q, accepted before and after the subcommand (SUPPRESS: a subcommand does not reset the top's)."""
    g = parser.add_argument_group("output")
    g.add_argument("-v", "--verbose", action="count", default=0 if top else argparse.SUPPRESS,
                   help="more detail on stderr: pileprep's INFO logs (-vv: DEBUG, tracebacks)")
    g.add_argument("-q", "--quiet", action="store_true", default=False if top else argparse.SUPPRESS,
                   help="no progress, only errors")


def _subcommand(sub, name: str, func, help_text: str, beam_args: bool = False, path_errors: bool = True,
                **kw) -> argparse.ArgumentParser:
    """A subcommand with -v/-q. `path_errors`: a missing or unwritable path in this command names a path the
    user gave (inspect DIR, sample --output), so OSErrors about paths are user errors; in `shard` they can
    also come from the run itself (a vanished staging file), which is a failed run."""
    p = sub.add_parser(name, help=help_text, description=help_text, **kw)
    _verbosity(p, top=False)
    p.set_defaults(func=func, accepts_beam_args=beam_args, subparser=p, path_errors=path_errors)
    return p


PATH_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, FileExistsError)


# -------------------------------------------------------------------------------------------- commands
def cmd_shard(args, beam_args) -> int:
    config = options.build(ShardConfig, args)
    run = options.build(RunOptions, args)
    if run.dry_run:
        from pipeline.tools import dry_run  # noqa: PLC0415

        # This process is as fresh as a real run's driver: its CPU so far (interpreter, imports) is start-up.
        print(dry_run.format_estimate(dry_run.estimate(config, beam_args, incremental_run=run.incremental,
                                                       workers=run.dry_run_workers,
                                                       process_startup_cpu_s=dry_run.process_cpu_s())))
        return 0
    from pipeline.ops import guards  # noqa: PLC0415

    def shard(worker_log):
        from pipeline.shard import shard_pipeline  # noqa: PLC0415 - Beam's import noise goes to the log

        tty = worker_log.stderr.isatty()
        every = run.progress_every if run.progress_every is not None else (
            0.0 if args.quiet else 1.0 if tty else 10.0)
        return shard_pipeline.run_outcome(config, beam_args, incremental_run=run.incremental,
                                          run_log=run.run_log, progress_every_s=every)

    outcome = _in_worker_log(guards.staging_root(config.output, config.staging_dir), args, shard)
    from pipeline.tools.inspect_dataset import summary_table  # noqa: PLC0415

    print_outcome(outcome)
    print(summary_table(outcome.manifest))
    return 0


def cmd_sample(args, _beam_args) -> int:
    from pipeline.tools.sample_corpus import write_sample_corpus  # noqa: PLC0415

    if not 0 < args.size_mb < float("inf"):  # NaN fails too
        raise UsageError(f"sample: --size-mb must be a positive number of megabytes, got {args.size_mb}")
    print(json.dumps(write_sample_corpus(args.output, target_mb=args.size_mb, overwrite=args.overwrite), indent=1,
                     sort_keys=True))
    return 0


def cmd_tokenizer_train(args, _beam_args) -> int:
    from pipeline.tools.tokenizer_train import train  # noqa: PLC0415

    print(json.dumps(train(args.kind, args.input, args.output, args.vocab_size, overwrite=args.overwrite), indent=1,
                     sort_keys=True))
    return 0


def _filesystem_args(beam_args) -> None:
    """inspect/report/export on s3://: Beam's filesystem options (--s3_endpoint_url, ...) after the command."""
    if beam_args:
        from apache_beam.options.pipeline_options import PipelineOptions  # noqa: PLC0415

        from transforms.io.filesystem_options import set_filesystem_options  # noqa: PLC0415

        set_filesystem_options(PipelineOptions(beam_args))


def cmd_inspect(args, beam_args) -> int:
    from pipeline.tools.inspect_dataset import inspect, inspect_json  # noqa: PLC0415

    _filesystem_args(beam_args)
    if args.json:
        print(json.dumps(inspect_json(args.dataset, examples=args.examples), indent=1, sort_keys=True))
    else:
        print(inspect(args.dataset, examples=args.examples, tokenizer_path=args.tokenizer))
    return 0


def cmd_report(args, beam_args) -> int:
    from pipeline.tools.report import write_report  # noqa: PLC0415

    _filesystem_args(beam_args)
    print(write_report(args.dataset, args.output, args.metrics, args.run_log))
    return 0


def cmd_export(args, beam_args) -> int:
    from pipeline.tools.export import export_parquet  # noqa: PLC0415

    _filesystem_args(beam_args)
    if args.format != "parquet":  # Megatron, HF datasets, MDS: pipeline/tools/export_formats.py
        from pipeline.tools.export_formats import export_format  # noqa: PLC0415

        summary = export_format(args.dataset, args.format, args.output, s3_options=_s3_options(beam_args))
        print(json.dumps({k: v for k, v in summary.items() if k != "files"} | {"files": len(summary["files"])},
                         indent=1, sort_keys=True))
        return 0
    # The store's options for the output lock on an s3:// --output (pipeline/ops/lock.py), as `gc` passes them.
    print(json.dumps(export_parquet(args.dataset, args.output, s3_options=_s3_options(beam_args)), indent=1,
                     sort_keys=True))
    return 0


def _s3_options(beam_args) -> dict:
    """Beam's s3_* options after the command, for a lock on an s3:// output (pipeline/ops/lock.py)."""
    from pipeline.beam_glue import FilesystemOptions, s3_options_of  # noqa: PLC0415
    from apache_beam.options.pipeline_options import PipelineOptions  # noqa: PLC0415

    return s3_options_of(FilesystemOptions.from_pipeline_options(PipelineOptions(beam_args))) if beam_args else {}


def cmd_gc(args, beam_args) -> int:
    from pipeline.tools.gc import gc  # noqa: PLC0415

    _filesystem_args(beam_args)
    s3 = _s3_options(beam_args)
    print(gc(args.dataset, args.keep_generations, args.yes, s3_options=s3, break_lock=args.break_lock).render())
    return 0


def cmd_verify(args, beam_args) -> int:
    from pipeline.tools.verify import verify  # noqa: PLC0415

    report = verify(args.dataset, inputs=args.inputs, sample=args.sample, seed=args.seed,
                    tokenizer_path=args.tokenizer, filesystem_args=beam_args)
    print(report.render())
    return 0 if report.ok else 1


def cmd_env(args, _beam_args) -> int:
    from pipeline.tools import environment  # noqa: PLC0415

    report = environment.report()
    print(json.dumps(report, indent=1, sort_keys=True) if args.json else environment.format_report(report))
    return 0


def cmd_retrieval(args, beam_args) -> int:
    from pipeline.retrieval import cli as retrieval_cli  # noqa: PLC0415 - Beam/Faiss only for this command

    def run_and_print(_worker_log=None) -> int:
        print(retrieval_cli.command_output(args, beam_args))
        return 0

    if args.retrieval_command == "show":
        return run_and_print()
    from pipeline.ops import guards  # noqa: PLC0415

    return _in_worker_log(guards.staging_root(args.output, None), args, run_and_print)


def _in_worker_log(staging_root: str, args, fn):
    """`fn(worker_log)` with Beam's and its workers' stderr in the worker log (pipeline/ops/runlog.py): an
    interrupt or a known failure ends in one line, a failed run shows the log's tail and where it is kept."""
    from pipeline.ops import runlog  # noqa: PLC0415

    worker_log = runlog.WorkerLog(staging_root)
    try:
        with worker_log, _user_view(worker_log, args):
            return fn(worker_log)
    except (KeyboardInterrupt, RunInterrupted):
        worker_log.keep()  # what the workers were doing when interrupted
        raise
    except Exception as e:
        if is_user_error(e):
            worker_log.discard()
            raise
        if isinstance(e, RunError):  # a known cause, said in one line (the worker log is kept, not shown)
            worker_log.keep()
            raise
        raise RunFailed(e, worker_log.last_lines, worker_log.keep()) from e


# ---------------------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="pileprep", description="The Pile (or any JSON-lines corpus) -> tokenized, packed "
                                                 "TFRecord shards with a manifest, on Apache Beam.",
                    epilog="`pileprep COMMAND --help` lists a command's options and their defaults.")
    parser.add_argument("--version", action="version", version=f"pileprep {PILEPREP_VERSION}")
    _verbosity(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)

    shard = _subcommand(sub, "shard", cmd_shard, "tokenize, pack and shard a corpus into TFRecords + manifest",
                        beam_args=True, path_errors=False, epilog="Other options go to Apache Beam (--runner, --project, "
                                               "--temp_location, ...), see README 'Running on Dataflow, Flink "
                                               "or Spark'.")
    shard.add_argument("--config", metavar="FILE.toml", default=None,
                       help="read options from a TOML file (keys are the option names, e.g. seq-len = 2048; "
                            "beam-args = [...] for Beam options); options on the command line override it")
    options.add_options(shard, ShardConfig)
    options.add_options(shard, RunOptions)

    sample = _subcommand(sub, "sample", cmd_sample, "write the embedded Pile-format sample corpus")
    sample.add_argument("--output", required=True, help="directory to write the sample corpus to")
    sample.add_argument("--size-mb", type=float, default=24.0, metavar="N",
                        help="uncompressed size to write, in MB (10^6 bytes); past the installation's text, "
                             "marked copies of its documents fill the rest (the throughput benchmark's 96/384 MB)")
    sample.add_argument("--overwrite", action="store_true",
                        help="replace files in --output that an earlier `pileprep sample` did not write")

    tok = sub.add_parser("tokenizer", help="tokenizer tools", description="tokenizer tools")
    _verbosity(tok, top=False)
    tok_sub = tok.add_subparsers(dest="tokenizer_command", required=True, metavar="COMMAND", parser_class=Parser)
    train = _subcommand(tok_sub, "train", cmd_tokenizer_train,
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
    inspect = _subcommand(sub, "inspect", cmd_inspect,
                          "print a dataset's manifest summary and decode a few examples", epilog=s3_help)
    inspect.add_argument("dataset", help="dataset directory or manifest.json (local or s3://)")
    inspect.add_argument("--examples", type=int, default=2, help="examples to decode")
    inspect.add_argument("--tokenizer", default=None, help="decode with this model (default: the manifest's)")
    inspect.add_argument("--json", action="store_true", help="machine-readable: the manifest and decoded examples")

    report = _subcommand(sub, "report", cmd_report, "write a self-contained HTML page (plots embedded) about a "
                         "dataset", epilog=s3_help)
    report.add_argument("dataset", help="dataset directory (local or s3://)")
    report.add_argument("--output", default=None, help="where to write the page (default DATASET/report.html)")
    report.add_argument("--metrics", default=None, metavar="FILE",
                        help="the trainer's metrics JSON lines (--metrics-file): adds loss and throughput curves")
    report.add_argument("--run-log", default=None, metavar="FILE",
                        help="the shard run's --run-log: adds its wall time to the headline")

    export = _subcommand(sub, "export", cmd_export, "write a dataset's shards in another format (Parquet, "
                         "Megatron .bin/.idx, HF datasets, MosaicML MDS)", epilog=s3_help)
    export.add_argument("dataset", help="dataset directory (local or s3://)")
    export.add_argument("--format", choices=["parquet", "megatron", "hf", "mds"], default="parquet",
                        help="output format: parquet; megatron (documents, <split>_text_document.bin/.idx); hf "
                        "(Parquet + dataset card for datasets.load_dataset); mds (MosaicML StreamingDataset)")
    export.add_argument("--output", default=None, help="output directory (default DATASET/FORMAT)")
    gc = _subcommand(sub, "gc", cmd_gc, "remove a dataset's generations that nobody keeps (dry run unless --yes; "
                     "docs/OPERATIONS.md)", epilog=s3_help)
    gc.add_argument("dataset", help="dataset directory (local or s3://)")
    gc.add_argument("--yes", action="store_true", help="remove what the dry run lists (and refs whose holder is gone)")
    gc.add_argument("--keep-generations", type=int, default=1, metavar="N",
                    help="previous generations kept beside the live one, as `shard --keep-generations`")
    gc.add_argument("--break-lock", action="store_true", help="remove a gone run's lock on DATASET first")
    for p in (inspect, report, export, gc):
        p.set_defaults(filesystem_args=True)

    verify = _subcommand(sub, "verify", cmd_verify,
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

    env = _subcommand(sub, "env", cmd_env, "print versions and whether the C extensions (varint codec, word "
                      "shingles) are active")
    env.add_argument("--json", action="store_true", help="machine-readable output")

    help_text = "retrieval-context corpora: chunk database, index, neighbours (docs/RETRIEVAL.md)"
    retrieval = sub.add_parser("retrieval", help=help_text, description=help_text)
    _verbosity(retrieval, top=False)
    rsub = retrieval.add_subparsers(dest="retrieval_command", required=True, metavar="COMMAND", parser_class=Parser)
    from pipeline.retrieval.cli import add_parsers  # noqa: PLC0415 - argument definitions only, no Beam/Faiss

    add_parsers(lambda name, text: _subcommand(rsub, name, cmd_retrieval, text, beam_args=name != "show"))
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
    return args, rest


@contextlib.contextmanager
def _user_view(worker_log, args):
    """While fd 2 goes to the worker log: progress and pileprep's own warnings (INFO with -v) still reach the
    user's stderr; the log file gets everything at INFO."""
    from pipeline.ops import progress  # noqa: PLC0415

    display = progress.Display(worker_log.stderr, tty=worker_log.stderr.isatty())
    progress_log = logging.getLogger("pileprep.progress")
    handler = None
    saved = (logging.getLogger().level, LOG.level)
    if not args.quiet:
        progress_log.addHandler(display)
    if worker_log.path:  # fd 2 is the log file: root's handler writes there
        handler = logging.StreamHandler(worker_log.stderr)
        handler.setLevel(logging.DEBUG if args.verbose > 1 else logging.INFO if args.verbose else logging.WARNING)
        handler.setFormatter(SinkFormatter(logging.Formatter("pileprep: %(levelname)s %(message)s")))
        handler.addFilter(lambda r: not progress.is_progress_record(r))
        handler.addFilter(RedactingFilter())
        LOG.addHandler(handler)
        logging.getLogger().setLevel(min(saved[0], logging.INFO))
        LOG.setLevel(logging.DEBUG if args.verbose > 1 else logging.INFO)
    elif not args.quiet:
        progress_log.setLevel(logging.INFO)
    try:
        yield display
    finally:
        display.finish()
        progress_log.removeHandler(display)
        if handler is not None:
            LOG.removeHandler(handler)
        logging.getLogger().setLevel(saved[0])
        LOG.setLevel(saved[1])


def _quiet_beam_import_warning(record: logging.LogRecord) -> bool:
    """Beam warns on import that apitools is missing whenever the gcp extra is not installed; pileprep only
    needs it for Dataflow, and checks for it when --runner names Dataflow (pipeline/options.py)."""
    return not record.getMessage().startswith("apitools not found")


def _configure_logging(args=None) -> None:
    """Before parsing (Beam's imports log), and again with the level -v / -q ask for."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        for handler in logging.getLogger().handlers:
            handler.addFilter(_quiet_beam_import_warning)
            handler.addFilter(RedactingFilter())  # credentials in URLs never reach a log line
        install_sink_formatters()  # ... nor a traceback's; and data in a record is inert (pipeline/ops/redaction.py)
    if args is not None:
        verbose = getattr(args, "verbose", 0) or 0
        quiet = getattr(args, "quiet", False)
        logging.getLogger().setLevel(logging.DEBUG if verbose > 1 else logging.INFO if verbose
                                     else logging.ERROR if quiet else logging.WARNING)


def main(argv=None) -> int:
    argv_is_the_process = argv is None  # `pileprep ...` / `python -m pipeline.cli ...`, not a caller in-process
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = 0
    args = None
    _configure_logging()
    restore = _terminate_in_one_line()
    try:
        args, beam_args = parse(argv)
        verbose = getattr(args, "verbose", 0) or 0
        _configure_logging(args)
        return args.func(args, beam_args)
    except RunInterrupted as e:  # the run committed nothing (pipeline/job.py _abandon)
        if getattr(e, "outside_job", False):
            print("pileprep: interrupted", file=sys.stderr, flush=True)
            return e.exit_code
        noun = getattr(e, "output_noun", "dataset")  # set by the job runner (pipeline/job.py)
        print(f"pileprep: interrupted; previous {noun} intact{_kept(e)}", file=sys.stderr, flush=True)
        if argv_is_the_process and getattr(e, "exit_without_teardown", False):
            _exit_without_teardown(e.exit_code)
        return e.exit_code
    except KeyboardInterrupt:
        print("pileprep: interrupted", file=sys.stderr)
        return 130
    except RunError as e:
        print(f"pileprep: failed: {terminal(redact_userinfo(one_line(e)))}{_kept(e)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `pileprep inspect DIR | head`: the reader left; say nothing, like other tools
        try:
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python flushes stdout at exit
        except OSError:
            pass
        return 141
    except Exception as e:  # noqa: BLE001 - the one place that turns exceptions into exit codes
        if is_user_error(e) or (isinstance(e, PATH_ERRORS) and getattr(args, "path_errors", False)):
            print(f"pileprep: error: {terminal(redact_userinfo(one_line(e)))}", file=sys.stderr)
            return 2
        _report_failure(e if isinstance(e, RunFailed) else RunFailed(e, [], None), verbose)
        return 1
    finally:
        restore()


def _exit_without_teardown(code: int) -> None:
    """End an interrupted job's process now, its line printed and flushed, without interpreter teardown: only
    for a job whose `exit_without_teardown` says so (pipeline/job.py). The retrieval stages cannot be cancelled
    (pipeline/retrieval/store_job.py `stop_workers`), and a worker thread still in native code when the
    interpreter tore down aborted the process after the one line (SIGABRT, "terminate called without an active
    exception"), about one `retrieval neighbours` SIGTERM in six (tests/e2e/test_job_runner.py). A command that
    succeeded ends the ordinary way.
    The lock, staging and run log are already released by the job runner."""
    import logging  # noqa: PLC0415

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.shutdown()
    os._exit(code)


def _terminate_in_one_line():
    """SIGTERM before a job's own handler (pipeline/job.py `_signals_interrupt`) is installed - while a command
    imports Beam and plans, or in a command that is not a job (export, report, verify) - ends in the one line
    `pileprep: interrupted`, exit 143, instead of a silent death. Returns what restores the previous handler."""
    import signal  # noqa: PLC0415
    import threading  # noqa: PLC0415

    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def interrupt(signum, _frame):
        e = RunInterrupted(signum)
        e.outside_job = True
        raise e

    previous = signal.signal(signal.SIGTERM, interrupt)
    return lambda: signal.signal(signal.SIGTERM, previous)


def _report_failure(e: RunFailed, verbose: int) -> None:
    """A failed run: the worker log's tail, where the log is kept, and the error in one line."""
    cause = e.__cause__ or e
    if e.tail:
        print(f"pileprep: last {len(e.tail)} lines of the worker log ({e.log_path}):", file=sys.stderr)
        for line in e.tail:
            print("  " + line, file=sys.stderr)
    if verbose > 1:
        traceback.print_exception(cause)
    lines = [ln.strip() for ln in str(cause).splitlines() if ln.strip()] or [type(cause).__name__]
    # Beam wraps a worker's error with the worker's traceback: its first and last lines say what happened.
    message = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    if len(message) > 500:
        message = message[:497] + "..."
    print(f"pileprep: failed: {type(cause).__name__}: {terminal(redact_userinfo(message))}{_kept(cause)}"
          + ("" if verbose > 1 else " (-vv for the traceback)"), file=sys.stderr)


def _kept(e: BaseException) -> str:
    """'; N finished units and M packed shards kept for the next run …' when the failed run kept work for the next one (pipeline/job.py
    _with_kept), on the same one line."""
    kept = getattr(e, "kept_for_resume", "")
    return f"; {kept}" if kept else ""


if __name__ == "__main__":
    sys.exit(main())
