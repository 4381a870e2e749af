"""`pileprep` command line: shard, sample, tokenizer train, inspect, report, export, gc, verify, env, retrieval.

The flags are pipeline/cli_parser.py's; where a running command's logs go, pipeline/cli_logging.py. This module
runs the command the flags name (`_commands`) and turns its end into an exit code and what the user reads.

Exit codes: 0 done, 1 the run failed, 2 a user error (pipeline/errors.py: one line naming what to change).
Only this module prints; stdout gets results (summary tables, JSON), stderr gets progress and messages.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

from pipeline import options
from pipeline.cli_logging import RunFailed, configure_logging, in_worker_log
from pipeline.cli_parser import parse
from pipeline.config import RunOptions, ShardConfig
from pipeline.errors import RunError, RunInterrupted, UsageError, is_user_error, one_line
from pipeline.output import print_outcome
from pipeline.ops.redaction import redact_userinfo
from pipeline.ops.safe_text import terminal

PATH_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, FileExistsError)


# -------------------------------------------------------------------------------------------- commands
def cmd_shard(args, beam_args) -> int:
    from pipeline.tools.export_after_shard import export_committed, parse_formats  # noqa: PLC0415

    formats = parse_formats(getattr(args, "formats", None))  # a bad value: exit 2 before anything runs
    config = options.build(ShardConfig, args)
    run = options.build(RunOptions, args)
    if run.dry_run:
        from pipeline.tools import dry_run  # noqa: PLC0415
        from pipeline.tools.dry_run_calibration import process_cpu_s  # noqa: PLC0415

        # This process is as fresh as a real run's driver: its CPU so far (interpreter, imports) is start-up.
        print(dry_run.format_estimate(dry_run.estimate(config, beam_args, incremental_run=run.incremental,
                                                       workers=run.dry_run_workers,
                                                       process_startup_cpu_s=process_cpu_s())))
        return 0
    from pipeline.ops import guards  # noqa: PLC0415

    def shard(worker_log):
        from pipeline.shard import shard_pipeline  # noqa: PLC0415 - Beam's import noise goes to the log

        tty = worker_log.stderr.isatty()
        every = run.progress_every if run.progress_every is not None else (
            0.0 if args.quiet else 1.0 if tty else 10.0)
        return shard_pipeline.run_outcome(config, beam_args, incremental_run=run.incremental,
                                          run_log=run.run_log, progress_every_s=every)

    outcome = in_worker_log(guards.staging_root(config.output, config.staging_dir), args, shard)
    from pipeline.tools.inspect_dataset import summary_table  # noqa: PLC0415

    print_outcome(outcome)
    print(summary_table(outcome.manifest))
    if len(formats) > 1:  # the other formats: exports of the committed generation (export_after_shard.py)
        _filesystem_args(beam_args)
        for line in export_committed(config.output, formats, s3_options=_s3_options(beam_args),
                                     break_lock=config.break_lock):
            print(line, flush=True)
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
    if args.format != "parquet" or args.by_source:  # Megatron, HF, MDS: pipeline/tools/export_formats.py
        from pipeline.tools.export_formats import export_format  # noqa: PLC0415

        summary = export_format(args.dataset, args.format, args.output, s3_options=_s3_options(beam_args),
                                by_source=args.by_source, break_lock=args.break_lock)
        shown = {k: v for k, v in summary.items() if k != "files"} | {"files": len(summary["files"])}
        if args.by_source:  # Megatron-LM's arguments for the blend, prefixes absolute
            from pipeline.tools.export_megatron import blend_arguments  # noqa: PLC0415

            shown["megatron_arguments"] = blend_arguments(summary, summary["output"])
        print(json.dumps(shown, indent=1, sort_keys=True))
        return 0
    # The store's options for the output lock on an s3:// --output (pipeline/ops/lock.py), as `gc` passes them.
    print(json.dumps(export_parquet(args.dataset, args.output, s3_options=_s3_options(beam_args),
                                    break_lock=args.break_lock), indent=1, sort_keys=True))
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

    return in_worker_log(guards.staging_root(args.output, None), args, run_and_print)


def _commands() -> dict:
    """The handler of each command (`args.command`, pipeline/cli_parser.py), looked up when a command runs."""
    return {"shard": cmd_shard, "sample": cmd_sample, "tokenizer": cmd_tokenizer_train, "inspect": cmd_inspect,
            "report": cmd_report, "export": cmd_export, "gc": cmd_gc, "verify": cmd_verify, "env": cmd_env,
            "retrieval": cmd_retrieval}


# ------------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    argv_is_the_process = argv is None  # `pileprep ...` / `python -m pipeline.cli ...`, not a caller in-process
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = 0
    args = None
    configure_logging()
    restore = _terminate_in_one_line()
    try:
        args, beam_args = parse(argv)
        verbose = getattr(args, "verbose", 0) or 0
        configure_logging(args)
        return _commands()[args.command](args, beam_args)
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
