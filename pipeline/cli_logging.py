"""Where a command's output goes while it runs (pipeline/cli.py): the logging set up before and after parsing,
and a job's worker log (pipeline/ops/runlog.py), which takes Beam's and its workers' stderr while progress and
pileprep's own warnings still reach the user's stderr. Nothing here prints: a failed run comes back as
`RunFailed`, which pipeline/cli.py reports.
"""
from __future__ import annotations

import contextlib
import logging

from pipeline.errors import RunError, RunInterrupted, is_user_error
from pipeline.ops.redaction import RedactingFilter, SinkFormatter, install_sink_formatters

LOG = logging.getLogger("pileprep")


class RunFailed(Exception):
    """A run failed (not a user error): carries the worker log's tail and where the log is kept."""

    def __init__(self, cause: BaseException, tail: list, log_path):
        super().__init__(str(cause))
        self.tail = tail
        self.log_path = log_path
        self.__cause__ = cause


def in_worker_log(staging_root: str, args, fn):
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


def _quiet_beam_noise(record: logging.LogRecord) -> bool:
    """Two warnings Beam gives on every run of a kind, which would follow pileprep's one last line:
    - on import, that apitools is missing whenever the gcp extra is not installed; pileprep only needs it for
      Dataflow, and checks for it when --runner names Dataflow (pipeline/options.py);
    - at exit, "Really destroying service ..." with the job server's command line: Beam's normal stop of the
      Spark/Flink job server it started (apache_beam/utils/subprocess_server.py logs every stop at WARNING)."""
    message = record.getMessage()
    if message.startswith("apitools not found"):
        return False
    return not (record.name == "apache_beam.utils.subprocess_server" and message.startswith("Really destroying"))


def configure_logging(args=None) -> None:
    """Before parsing (Beam's imports log), and again with the level -v / -q ask for."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        for handler in logging.getLogger().handlers:
            handler.addFilter(_quiet_beam_noise)
            handler.addFilter(RedactingFilter())  # credentials in URLs never reach a log line
        install_sink_formatters()  # ... nor a traceback's; and data in a record is inert (pipeline/ops/redaction.py)
    if args is not None:
        verbose = getattr(args, "verbose", 0) or 0
        quiet = getattr(args, "quiet", False)
        logging.getLogger().setLevel(logging.DEBUG if verbose > 1 else logging.INFO if verbose
                                     else logging.ERROR if quiet else logging.WARNING)
