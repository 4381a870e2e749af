"""The shard job's driver: `ShardJob`, its steps for the job runner (pipeline/job.py: lock, cleanup, abandon,
the commit check), and `run`, the library form of `pileprep shard`.

Read -> commit in three files: pipeline/shard/graph.py (the Beam graph, top to bottom), pipeline/shard/stage_dofn.py
(each stage: reuse or compute, mark, count) and pipeline/shard/manifest_builder.py (the manifest the commit
writes); the stages' work is in transforms/shard/. The driver's other steps are one module each:
pipeline/shard/preflight.py (checks), plan.py (the plan and the nothing-to-do decision), resume.py (what a killed
run left).
"""
from __future__ import annotations

import dataclasses
import errno
import logging
import re
import time
from dataclasses import dataclass
from typing import Optional

from pipeline import job
from pipeline.beam_glue import chosen_running_mode, pipeline_options
from pipeline.config import PILEPREP_VERSION, ShardConfig
from pipeline.errors import RunError
from pipeline.output import print_outcome
from pipeline.ops import commit, guards, progress, runlog
from pipeline.ops import generations
from pipeline.ops.engines import submit
from pipeline.shard import cancel, graph, integrity, preflight, resume, unit_plan
from pipeline.shard.plan import JobPlan, stage_model
from pipeline.shard import plan as shard_plan
from transforms.io import io_utils, memory
from transforms.io.filesystem_options import set_filesystem_options

LOG = logging.getLogger("pileprep.shard")


# ------------------------------------------------------------------------------------------------ the job
def prepare(config: ShardConfig, incremental_run: bool = False) -> JobPlan:
    """The plan a run would make (config checked first): for `--dry-run` and tests, no lock, nothing written."""
    preflight.check_config(config)
    return shard_plan.make_plan(config, incremental_run)


class ShardJob(job.Job):
    """The shard job's steps for the job runner (pipeline/job.py)."""

    kind = commit.KIND_DATASET
    noun = "dataset"

    def __init__(self, config: ShardConfig, beam_args=None, incremental_run: bool = False,
                 run_log: Optional[str] = None, progress_every_s: float = 10.0):
        self.config = config
        self.output = config.output
        self.break_lock = config.break_lock
        self.beam_args = list(beam_args or [])
        self.options = pipeline_options(beam_args)
        self.incremental_run = incremental_run
        self.progress_every_s = progress_every_s
        self.log = runlog.RunLog(run_log)
        self.checked: Optional[preflight.Checked] = None

    def describe(self) -> dict:
        return {"output": self.config.output, "inputs": list(self.config.inputs), "incremental": self.incremental_run,
                "runner": self.options.get_all_options().get("runner"), "config": self.config.to_manifest_dict()}

    def preflight(self) -> None:
        memory.configure_child_processes()
        set_filesystem_options(self.options)  # the driver lists inputs and reads the manifest with the job's S3 settings
        self.checked = preflight.check(self.config, self.options)

    def s3_options(self) -> dict:
        return self.checked.s3_options

    def staging_root(self) -> str:
        return guards.staging_root(self.config.output, self.config.staging_dir)

    def read_committed(self):
        return commit.read_committed(self.config.output)

    def live_generations(self, committed) -> set:
        # and the kept previous generations (pipeline/ops/generations.py): start-up cleanup never removes them
        return integrity.referenced_generations(committed) | generations.retained(self.output)

    def plan(self, committed) -> JobPlan:
        plan = shard_plan.make_plan(self.config, self.incremental_run, committed, self.checked.filesystem_options)
        for row in plan.skipped_inputs:
            LOG.warning("--input matched %s: %s; skipped", row["path"], row["reason"].replace("_", " "))
            self.log.event("warning", skipped_input=row["path"], reason=row["reason"])
        self.log.event("plan", generation=plan.generation, files=len(plan.ledger), input_bytes=plan.input_bytes,
                       incremental=plan.incremental)
        # Under the lock, before the decision: what a killed run left is reused or discarded (with a note) even
        # when there is nothing to do (pipeline/shard/resume.py)
        found = resume.reconcile(plan, not self.config.no_resume, self.live_generations(committed))
        self.log.event("resume", **found.to_event())
        return dataclasses.replace(plan, resumed_cuts=found.cuts, resumed_units=found.units,
                                   resumed_packs=found.packs, resumed_near_dedup=found.near_dedup)

    def decide(self, plan: JobPlan) -> job.Decision:
        return shard_plan.decide(plan)

    def stage(self, plan: JobPlan) -> JobPlan:
        resume.write_resume_record(plan)  # before any work: a killed run's staging is then resumable
        return stage_model(plan)

    def execute(self, plan: JobPlan) -> Executed:
        raw_bytes = sum(unit_plan.raw_bytes_estimate(e.path, e.size) for e in plan.ledger)
        mode = chosen_running_mode(self.options, self.beam_args, raw_bytes)  # None: the user chose the runner
        if mode is not None:
            LOG.info("default runner: %s workers for ~%d MB of raw input (beam_glue.default_running_mode)",
                     "process" if mode == "multi_processing" else "thread", raw_bytes >> 20)
            self.log.event("running_mode", mode=mode, raw_bytes_estimate=raw_bytes)
        return _execute(plan, self.options, self.log, self.progress_every_s)

    def scratch_dirs(self, plan: JobPlan) -> list:
        return [plan.staging_dir, progress.marker_dir(plan.staging_dir)]

    def abandon(self, plan: JobPlan, committed: bool) -> str:
        """A failed or interrupted run keeps its finished units and packed shards for the next run, as a killed
        one does (pipeline/shard/resume.py keep_finished); with --no-resume (or once committed after all) its
        partial generation and staging go, as before."""
        if committed or self.config.no_resume:
            return super().abandon(plan, committed)
        kept = resume.keep_finished(plan)
        return f"{kept.describe()} kept for the next run (--no-resume discards them)" if kept else ""

    def stop_workers(self) -> None:
        """Worker threads of this process stop before the driver removes what they write (cancel.py)."""
        if not cancel.cancel_and_wait():
            LOG.warning("in-process workers did not stop within 30 s; removing the partial generation anyway")

    def known_failure(self, error: BaseException, plan: JobPlan) -> Optional[RunError]:
        """A RunError for failures with a known cause (Beam wraps worker exceptions in its own, with tracebacks)."""
        text = str(error)
        if isinstance(error, RunError):
            return error
        if (isinstance(error, OSError) and error.errno == errno.ENOSPC) or "No space left on device" in text:
            return RunError(f"no space left on device while writing {plan.data_dir} or {plan.staging_dir}; "
                            "nothing was committed and the previous dataset is intact. Free space (or "
                            "choose another --output / --staging-dir) and run again")
        found = re.search(r"RunError: ([^\n]+)", text)
        return RunError(found.group(1).strip()) if found else None

    def on_committed(self, plan: JobPlan, committed, executed: Executed) -> str:
        self.log.event("committed", manifest=commit.manifest_location(self.config.output),
                       generation=plan.generation, generations=len(committed.generations),
                       shards=len(committed.shards), splits=committed.splits)
        self.log.event("summary", **executed.summary_event())
        return progress.summary_table(executed.counters, executed.elapsed_s)


def run_outcome(config: ShardConfig, beam_args=None, incremental_run: bool = False, run_log: Optional[str] = None,
                progress_every_s: float = 10.0) -> job.JobOutcome:
    """Run the shard job to completion (pipeline/job.py: run_job); the outcome pipeline/cli.py prints.

    `incremental_run`: add only new input files as a new generation (pipeline/ops/incremental.py). `run_log`:
    JSON-lines event log (pipeline/ops/runlog.py). `progress_every_s`: progress line period (0 = off).
    """
    return job.run_job(ShardJob(config, beam_args, incremental_run, run_log, progress_every_s))


def run(config: ShardConfig, beam_args=None, incremental_run: bool = False, run_log: Optional[str] = None,
        progress_every_s: float = 10.0) -> dict:
    """The library form of `pileprep shard`: run (see run_outcome), print the outcome as the command does
    (pipeline/output.py: print_outcome, as the CLI prints it) and return the committed manifest as a dict."""
    outcome = run_outcome(config, beam_args, incremental_run, run_log, progress_every_s)
    print_outcome(outcome)
    return outcome.manifest


@dataclass(frozen=True)
class Executed:
    """What a finished pipeline measured: wall seconds and the merged counters."""
    elapsed_s: float
    counters: dict[str, int]  # counter name -> count (pipeline/ops/progress.py)
    input_bytes: int
    files: int

    def summary_event(self) -> dict:
        final = progress.Progress(self.elapsed_s, self.counters, self.input_bytes, self.files)
        return {"wall_s": round(self.elapsed_s, 3), **{k: v for k, v in final.to_dict().items() if k != "eta_s"}}


def _execute(plan: JobPlan, options, log, progress_every_s) -> Executed:
    """Build and run the pipeline (its last step commits). On a failure the job runner stops in-process
    workers first and then removes the staging, but for the finished work (ShardJob.abandon)."""
    config = plan.config
    started = time.time()
    cancel.reset()
    holder: dict = {}
    markers = progress.MarkerReader(plan.staging_dir)
    reporter = progress.ProgressReporter(
        [markers.snapshot, lambda: progress.counters_from_result(holder["result"]) if "result" in holder else {}],
        plan.input_bytes, len(plan.ledger), progress_every_s,
        on_progress=lambda pr: log.event("progress", **pr.to_dict()))
    with reporter:
        p = submit.pipeline(options)  # no S3 secret to an engine's UI; the driver keeps its credentials
        shuffle = graph.shuffle_for(p, plan)
        spread_chunks = graph.spread_chunks_needed(plan, options)
        LOG.info("shuffle: %s (--shuffle %s, runner %s)", shuffle, config.shuffle, type(p.runner).__name__)
        log.event("shuffle", shuffle=shuffle, choice=config.shuffle, spread_chunks=spread_chunks)
        _ = p | "Shard" >> graph.BuildShards(plan, spread_chunks, shuffle)
        holder["result"] = result = p.run()  # FnApiRunner returns when done; portable runners at once
        submit.wait_or_cancel(result, p.options)  # Ctrl-C cancels a cluster's job before the staging goes
    elapsed = time.time() - started
    state = str(getattr(result, "state", "DONE"))
    if "FAIL" in state.upper() or "CANCEL" in state.upper():
        raise RuntimeError(f"the pipeline ended in state {state}; nothing was committed")
    counters = progress.final_counters(progress.counters_from_result(result), markers.snapshot())
    io_utils.delete_tree(progress.marker_dir(plan.staging_dir))
    counters.pop("split_raw_bytes", None)
    LOG.info("shard job finished in %.1fs (pileprep %s)", elapsed, PILEPREP_VERSION)
    return Executed(elapsed, counters, plan.input_bytes, len(plan.ledger))
