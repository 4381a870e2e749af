"""The shard job: inputs → chunks → tokenized units → packed TFRecord shards → manifest (written last).

Wiring only; the work is in transforms/shard/ (cut.py, tokenize_unit.py, exact_dedup.py, pack.py; the records
they hand each other in records.py). Bulk data moves through files in the staging directory, elements are small
descriptors, and every name and order is derived from the input and config, so the
output is byte-identical whatever the runner or the number of workers.

The driver's steps are elsewhere, one job each: pipeline/shard/preflight.py (checks), pipeline/shard/plan.py
(the plan and the nothing-to-do decision), pipeline/job.py (lock, cleanup, abandon, the commit check). This
module holds the DoFns, `build_pipeline`, and `ShardJob`, the shard job's steps for pipeline/job.py.
"""
from __future__ import annotations

import dataclasses
import errno
import logging
import pickle
import re
import time
from dataclasses import dataclass
from typing import Optional

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline import job
from pipeline.beam_glue import (FilesystemOptions, GatherAll, Spread,  # noqa: F401 - public names
                                apply_filesystem_options, chosen_running_mode, default_beam_args, pipeline_options)
from pipeline.config import PILEPREP_VERSION, ShardConfig
from pipeline.errors import RunError
from pipeline.output import print_outcome
from pipeline.ops import commit, guards, progress, runlog, runners
from pipeline.ops import generations
from pipeline.shard import (cancel, integrity, near_dedup_graph, near_dedup_settings, preflight, resume,
                            runner_shuffle, stage_dofn, unit_plan)
from pipeline.shard.manifest_builder import build_manifest, shard_write_tasks
from pipeline.shard.plan import MODEL_FILE_NAME, JobPlan, stage_model  # noqa: F401 - the job's public names
from pipeline.shard import plan as shard_plan
from transforms.shard import exact_dedup, tokenize_unit
from transforms.shard.records import CommitParts
from transforms.io import io_utils, memory
from transforms.io.filesystem_options import set_filesystem_options

LOG = logging.getLogger("pileprep.shard")


def _sorted_units(units):
    return sorted(units, key=lambda u: u.name)


def _index_doc_ids(shard_results, plan: JobPlan) -> tuple:
    id_index = exact_dedup.write_generation_id_index(shard_results, plan.data_dir)
    io_utils.fsync_files([id_index[0]])  # durable before the manifest that references it (pipeline/ops/commit.py)
    return id_index


def _commit(grouped, plan: JobPlan):
    """The commit point: one element holding every stage's results (transforms/shard/records.py CommitParts)."""
    apply_filesystem_options(plan.filesystem_options)
    parts = CommitParts.gather(grouped)
    cut_outputs = sorted(parts.cuts, key=lambda s: s.result.file_idx)
    cut_results = [s.result for s in cut_outputs]
    digests = [s.digest for s in cut_outputs]
    manifest = build_manifest(plan.config, plan.contract, plan.ledger, plan.generation, plan.config.output,
                              cut_results, _sorted_units(parts.units), parts.shards)
    guards.check_dead_letter_rate(manifest.records, plan.config.max_dead_letter_fraction)
    manifest = integrity.add_integrity_sections(manifest, plan.config.output, plan.generation, parts.shards,
                                                _index_doc_ids(parts.shards, plan))
    manifest = integrity.add_ledger(manifest, plan.generation, list(plan.input_rows), {d.path: d for d in digests})
    manifest.skipped_inputs = [dict(r) for r in plan.skipped_inputs]
    previous = plan.previous
    if plan.incremental:
        manifest = integrity.merge(previous, manifest)
    manifest.kind = commit.KIND_DATASET  # checked before any commit into this output (ops/commit.py)
    if plan.tokenizer_backend is not None:  # how this generation was tokenized; the only backend-dependent field
        manifest.extra["tokenizer_backend"] = plan.tokenizer_backend.to_manifest(
            tokenize_unit.spot_check_totals(parts.units))
    commit.commit_dataset(plan.config.output, manifest,
                          None if previous is None else previous.generation, plan.staging_dir,
                          previous, plan.config.keep_generations)
    return manifest.to_dict()




UNIT_LIST_NAME = "units.pickle"


def _pack_tasks(units, plan: "JobPlan") -> list:
    """[(shard task, staged unit list path, dedup inputs)]: one element per shard for PackShard. The sorted
    unit list is staged once; each pack task carries only its path.

    Carrying the list in every task would move units × shards descriptors through the shuffle; a side input
    would be rebuilt per consumer on some runners. One staged file, read once per worker, does neither.
    """
    units, tasks, dedup = _units_tasks_dedup(units, plan)
    path = io_utils.join(plan.staging_dir, UNIT_LIST_NAME)
    io_utils.write_bytes(path, pickle.dumps(units, protocol=pickle.HIGHEST_PROTOCOL))
    return [(task, path, dedup) for task in tasks]


def _units_tasks_dedup(units, plan: "JobPlan") -> tuple:
    """(sorted units, shard tasks, dedup inputs): what both shuffles plan from the tokenized units."""
    apply_filesystem_options(plan.filesystem_options)
    units = _sorted_units(units)
    # Cross-split dedup needs every held-out id before any shard is packed: one global pass over the units'
    # (small) held-out key ranges here, where all units meet; packers skip ids a winning split or a committed
    # generation holds (transforms/shard/records.py DedupInputs: a few paths, cheap to carry in every task).
    dedup = dataclasses.replace(exact_dedup.index_held_out_ids(units, plan.staging_dir),
                                committed=plan.committed_id_indexes)
    return units, shard_write_tasks(units, plan.config), dedup


def _unit_elements(units, plan: "JobPlan") -> list:
    """The runner's shuffle: one element per unit carrying the shard plan (runner_shuffle.unit_elements)."""
    return runner_shuffle.unit_elements(*_units_tasks_dedup(units, plan))


def shuffle_for(p: beam.Pipeline, plan: "JobPlan") -> str:
    """'files' or 'runner': --shuffle resolved for the pipeline's runner (pipeline/ops/runners.py)."""
    return runners.choose_shuffle(plan.config.shuffle, type(p.runner).__name__)


def spread_chunks_needed(plan: JobPlan, options: PipelineOptions) -> bool:
    """Whether the chunks of one input file need their own redistribution step after the cut stage.

    The step lets the chunks of a big file tokenize on many workers, which the Pile's 30 files of ~14 GB need.
    It also makes the cut stage a barrier: no worker tokenizes until every file is cut. On the local runner
    with at least 4 files per worker and none much bigger than the rest (pipeline/shard/unit_plan.py
    whole_files_balance), whole files already keep every worker busy, so the step is left out and each worker
    tokenizes a file's chunks as soon as it has cut them (the stage fuses). DaskRunner gets the same rule with
    its cluster's worker threads (asked of the scheduler at `--dask_client_address`; Dask hands partitions to
    free workers, so whole files balance at least as well as FnApiRunner's round robin): at 96 MB on 2 workers
    the spread cost a cut barrier and hash-skewed tokenize tasks (docs/BENCHMARKS.md). Other remote runners,
    and Dask without an address, always keep it: their worker count is not known here. Output bytes are the
    same either way: names and order come from file and chunk indexes, never from placement.
    """
    opts = options.get_all_options()
    runner = str(opts.get("runner") or "")
    if runner == runners.DASK_RUNNER:
        threads = runners.dask_cluster_threads(opts)
        return threads is None or not unit_plan.whole_files_balance(plan.ledger, threads)
    if runner.rsplit(".", 1)[-1] not in ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner"):
        return True
    workers = int(opts.get("direct_num_workers") or 1)
    return not unit_plan.whole_files_balance(plan.ledger, workers)


def build_pipeline(p: beam.Pipeline, plan: JobPlan, spread_chunks: bool = True,
                   shuffle: Optional[str] = None):
    """Attach the shard job to a pipeline; returns the PCollection holding the committed manifest dict.

    The graph has no side inputs and no multi-output steps, and its one sink (the commit) depends on every
    stage through main inputs: the same graph then runs each stage exactly once on every runner, FnApiRunner,
    the portable runner, Dataflow/Flink/Spark and DaskRunner alike (which computes only the last step's graph
    and recomputes side inputs per consumer). `shuffle` ('files' or 'runner', default: `shuffle_for`) picks
    how documents reach their shard (docs/SHUFFLE.md); the output bytes are the same.
    """
    shuffle = shuffle or shuffle_for(p, plan)
    LOG.info("shuffle: %s (--shuffle %s, runner %s)", shuffle, plan.config.shuffle, type(p.runner).__name__)
    # Planned once here, on the driver, from the ledger and --unit-mb only (pipeline/shard/unit_plan.py)
    chunk_bytes = unit_plan.chunk_bytes_for(plan.ledger, plan.config.unit_bytes)
    files = (p
             | "ListInputs" >> beam.Create([(i, e.path, chunk_bytes) for i, e in enumerate(plan.ledger)])
             | "SpreadFiles" >> Spread(lambda f: f[0]))
    # The chunks go through staging where other workers tokenize them, or where the near-dedup stage reads them
    # again; else each file's chunks are tokenized by the worker that cuts them, as they are cut.
    if spread_chunks or near_dedup_settings.enabled(plan.config):
        cuts = files | "CutIntoChunks" >> beam.ParDo(stage_dofn.CutInputFile(plan))
        chunks = cuts | "Chunks" >> beam.FlatMap(lambda s: s.result.chunks)
        if spread_chunks:
            chunks = chunks | "SpreadChunks" >> Spread(lambda c: (c.file_idx, c.chunk_idx))
        units = chunks | "Tokenize" >> beam.ParDo(stage_dofn.TokenizeChunk(plan))
    else:
        tokenized = files | "CutAndTokenize" >> beam.ParDo(stage_dofn.CutAndTokenizeFile(plan))
        cuts = tokenized | "Cuts" >> beam.Map(lambda t: t.cut)
        units = tokenized | "Units" >> beam.FlatMap(lambda t: t.units)
    # After tokenize (exact dedup is by id), before packing and repeats; left out when an earlier run of this
    # generation finished it (its marker checked with every file's sha256: pipeline/shard/resume.py), since the
    # removals it staged depend only on the fingerprint.
    if near_dedup_settings.enabled(plan.config) and not plan.resumed_near_dedup:
        units = units | "NearDedup" >> near_dedup_graph.NearDedup(plan, shuffle)
    if shuffle == "runner":  # pieces through the runner's GroupByKey (pipeline/shard/runner_shuffle.py)
        shards = (units
                  | "CollectUnits" >> GatherAll()
                  | "PlanPieces" >> beam.FlatMap(_unit_elements, plan)
                  | "SpreadUnits" >> Spread(runner_shuffle.element_key)
                  | "EmitPieces" >> beam.ParDo(runner_shuffle.EmitPieces(plan))
                  | "GroupPieces" >> beam.GroupByKey()
                  | "PackShards" >> beam.ParDo(runner_shuffle.PackGroupedShard(plan)))
    else:
        shards = (units
                  | "CollectUnits" >> GatherAll()
                  | "PlanShards" >> beam.FlatMap(_pack_tasks, plan)
                  | "SpreadShards" >> Spread(lambda tu: (tu[0].split, tu[0].shard))
                  | "PackShards" >> beam.ParDo(stage_dofn.PackShard(plan)))
    return ((cuts, units, shards)  # told apart by type at the commit (transforms/shard/records.py)
            | "GatherForCommit" >> beam.Flatten()
            | "CollectForCommit" >> GatherAll()
            | "CommitManifest" >> beam.Map(_commit, plan))


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
    counters: dict
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
        p = beam.Pipeline(options=options)
        shuffle = shuffle_for(p, plan)
        spread_chunks = spread_chunks_needed(plan, options)
        log.event("shuffle", shuffle=shuffle, choice=config.shuffle, spread_chunks=spread_chunks)
        build_pipeline(p, plan, spread_chunks, shuffle)
        holder["result"] = result = p.run()  # FnApiRunner returns when done; portable runners at once
        result.wait_until_finish()
    elapsed = time.time() - started
    state = str(getattr(result, "state", "DONE"))
    if "FAIL" in state.upper() or "CANCEL" in state.upper():
        raise RuntimeError(f"the pipeline ended in state {state}; nothing was committed")
    counters = progress.merge_snapshots(progress.counters_from_result(result), markers.snapshot())
    io_utils.delete_tree(progress.marker_dir(plan.staging_dir))
    counters.pop("split_raw_bytes", None)
    LOG.info("shard job finished in %.1fs (pileprep %s)", elapsed, PILEPREP_VERSION)
    return Executed(elapsed, counters, plan.input_bytes, len(plan.ledger))
