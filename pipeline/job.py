"""One job runner for every pileprep job that commits an output (a shard dataset, a chunk database, a sidecar).

    preflight → lock → cleanup → plan → decide → stage → execute → (abandon on failure) → verify the commit

`run_job(job)` does those steps in that order, and the same way for every job: one writer per output (the
lock, pipeline/ops/lock.py), what a crashed run left removed under that lock, one exit when there is nothing
to do, the partial generation and staging removed after a failure or a signal (a job that resumes keeps its
finished work: `Job.abandon`), and the commit checked to be
the one this run made. A job supplies its own steps (the `Job` methods); it never prints: the returned
`JobOutcome` is what pipeline/cli.py prints.
"""
from __future__ import annotations

import abc
import contextlib
import logging
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any, Optional, Union

from pipeline.errors import RunError, RunInterrupted
from pipeline.ops import commit, guards, lock, redaction, runlog
from transforms.io import io_utils

LOG = logging.getLogger("pileprep.job")


@dataclass(frozen=True)
class NothingToDo:
    """The committed output already is what this run would make; `message` is the line the CLI prints."""
    message: str
    generation: Optional[str]


@dataclass(frozen=True)
class Build:
    """Run the job and commit `generation`."""
    generation: str


Decision = Union[NothingToDo, Build]


@dataclass(frozen=True)
class JobOutcome:
    """What a run did, for the CLI to print: the committed manifest (as a dict), whether this run committed it,
    the nothing-to-do line when it did not, and the job's own summary (the shard job's counter table)."""
    manifest: dict[str, Any]  # the committed manifest's JSON object: heterogeneous JSON
    generation: Optional[str]
    committed: bool
    message: str = ""
    summary: str = ""


class Job(abc.ABC):
    """The steps one kind of job supplies to `run_job`. A plan (whatever `plan()` returns) has `generation`,
    `data_dir` (the generation's directory in the output) and `staging_dir` (this run's staging)."""

    kind: str  # what the output holds (pipeline/ops/commit.py: KINDS), recorded in its manifest and checked
    noun: str = "output"  # how messages name the output ("dataset", "chunk database", "sidecar")
    output: str
    break_lock: bool = False
    log: runlog.RunLog
    # Its in-process workers cannot be cancelled (stop_workers only silences them): an interrupted run's process
    # ends without interpreter teardown once its line is printed (pipeline/cli.py `_exit_without_teardown`).
    exit_without_teardown: bool = False

    def describe(self) -> dict:
        """Fields of the run log's start event."""
        return {"output": self.output}

    @abc.abstractmethod
    def preflight(self) -> None:
        """Every check that needs no lock; raises ConfigError (exit 2) naming the option."""

    def s3_options(self) -> dict:
        return {}

    @abc.abstractmethod
    def staging_root(self) -> str:
        """Where this job's staging directories live (pipeline/ops/guards.py: staging_root)."""

    @abc.abstractmethod
    def read_committed(self):
        """The committed manifest of the output (the job's own type), or None."""

    @abc.abstractmethod
    def live_generations(self, committed) -> set:
        """The generation names the committed manifest references (never deleted)."""

    @abc.abstractmethod
    def plan(self, committed):
        """Everything decided before any work; `committed` is what read_committed returned under the lock."""

    @abc.abstractmethod
    def decide(self, plan) -> Decision:
        """NothingToDo or Build: the one exit before any work."""

    def stage(self, plan):
        """Write what workers read from staging (after the staging marker exists); returns the plan to run."""
        return plan

    @abc.abstractmethod
    def execute(self, plan):
        """Run the work, ending in the commit; returns what on_committed reports from."""

    def scratch_dirs(self, plan) -> list:
        """What a failed run removes besides its partial generation: its staging (and the job's siblings)."""
        return [plan.staging_dir]

    def abandon(self, plan, committed: bool) -> str:
        """After a failure or a signal, its workers stopped: remove the partial generation (unless the run
        committed it after all) and `scratch_dirs`. A job that resumes keeps its finished work instead and
        returns what it kept, for the CLI's one line ('' for nothing kept)."""
        if not committed:
            io_utils.delete_tree(plan.data_dir)
        for path in self.scratch_dirs(plan):
            io_utils.delete_tree(path)
        return ""

    def stop_workers(self) -> None:
        """Stop in-process workers before anything they write is removed (a failure or a signal)."""

    def known_failure(self, error: BaseException, plan) -> Optional[RunError]:
        """A RunError for failures with a known cause (one line, exit 1); None for others."""
        return error if isinstance(error, RunError) else None

    def committed_dict(self, committed) -> dict:
        return committed if isinstance(committed, dict) else committed.to_dict()

    def generation_of(self, committed) -> Optional[str]:
        return committed.get("generation") if isinstance(committed, dict) else committed.generation

    def on_committed(self, plan, committed, result) -> str:
        """Run-log events after a verified commit; returns a summary for the CLI ('' for none)."""
        return ""


def run_job(job: Job) -> JobOutcome:
    """Run `job` to completion: its committed output, or nothing changed (see the module docstring)."""
    job.log.event("start", **job.describe())
    try:
        with _signals_interrupt():
            return _run(job)
    except RunInterrupted as e:
        job.log.event("interrupted", signal=e.signum)
        e.output_noun = job.noun  # the CLI's one line: "interrupted; previous <noun> intact"
        e.exit_without_teardown = job.exit_without_teardown
        raise
    except Exception as e:
        job.log.event("error", type=type(e).__name__, message=redaction.redact(str(e)))
        raise
    finally:
        job.log.close()


def _run(job: Job) -> JobOutcome:
    job.preflight()
    with lock.OutputLock(job.output, job.s3_options()).held(job.break_lock):
        # Under the lock, before anything is read or removed: never another kind of output, nor a user's files.
        commit.check_output_kind(job.output, job.kind, job.staging_root())
        committed = job.read_committed()
        removed = guards.cleanup_abandoned(job.output, job.staging_root(), None,
                                           keep=job.live_generations(committed))
        if removed:
            LOG.warning("removed what an interrupted or crashed run left: %s", ", ".join(removed))
            job.log.event("cleanup", removed=removed)
        plan = job.plan(committed)
        decision = job.decide(plan)
        if isinstance(decision, NothingToDo):
            LOG.info("%s", decision.message)
            job.log.event("nothing_to_do", generation=decision.generation)
            return JobOutcome(job.committed_dict(committed), decision.generation, False, decision.message)
        guards.mark_staging(plan.staging_dir, job.output, plan.generation)
        try:
            result = job.execute(job.stage(plan))
            committed = _verify_commit(job, plan)
        except BaseException as e:
            job.stop_workers()  # before anything is removed: in-process workers write into staging
            kept = _abandon(job, plan)
            if isinstance(e, KeyboardInterrupt):
                raise _with_kept(RunInterrupted(signal.SIGINT), kept) from None
            if isinstance(e, RunInterrupted):
                raise _with_kept(e, kept)
            failure = job.known_failure(e, plan)
            if failure is None:
                raise _with_kept(e, kept)
            raise _with_kept(failure, kept) from None
        _remove_empty_default_staging(job)
        summary = job.on_committed(plan, committed, result)
        return JobOutcome(job.committed_dict(committed), plan.generation, True, summary=summary)


def _remove_empty_default_staging(job: Job) -> None:
    """After a commit, the default staging root `<output>/_staging` goes when nothing is left in it (the run
    created it; a killed run's resumable staging keeps it). A `--staging-dir` is the user's: never removed."""
    root = job.staging_root()
    if io_utils.is_local(root) and guards.normal_path(root) == guards.normal_path(
            io_utils.join(job.output, guards.DEFAULT_STAGING_NAME)):
        with contextlib.suppress(OSError):  # not empty, or already gone
            os.rmdir(root)


def _verify_commit(job: Job, plan):
    """The committed manifest, which must be the one this run wrote (its generation)."""
    committed = job.read_committed()
    if committed is None or job.generation_of(committed) != plan.generation:
        raise RuntimeError(f"the {job.noun} job finished but did not commit a manifest")
    return committed


def _abandon(job: Job, plan) -> str:
    """After a failure or an interrupt: remove this run's partial generation (unless it was committed after
    all) and its staging (`Job.abandon`: a resuming job keeps its finished work); the previous output is
    untouched. Returns what was kept for the next run ('' for nothing)."""
    try:
        return job.abandon(plan, plan.generation in job.live_generations(job.read_committed()))
    except Exception as e:  # noqa: BLE001 - the next run removes what is left (staging marker, lock held)
        LOG.warning("could not remove the partial generation %s: %s", plan.data_dir, type(e).__name__)
        return ""


def _with_kept(error: BaseException, kept: str) -> BaseException:
    """`error` carrying `kept_for_resume` (what staging keeps for the next run), which pipeline/cli.py adds to
    its one line."""
    if kept:
        try:
            error.kept_for_resume = kept
        except (AttributeError, TypeError):  # an exception type without a __dict__: the line just omits it
            pass
    return error


@contextlib.contextmanager
def _signals_interrupt():
    """SIGINT / SIGTERM raise RunInterrupted in the driver, so the run can remove its partial generation and
    the CLI can say so in one line (exit 130 / 143). Only the main thread can take signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, _frame):
        raise RunInterrupted(signum)

    saved = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
