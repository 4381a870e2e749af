"""The retrieval jobs' steps for the one job runner (pipeline/job.py): `retrieval build` (a chunk database) and
`retrieval neighbours` (a sidecar) get the shard job's lock, staging marker, cleanup of what a crashed run
left, interrupt handling and commit checks through it, and commit through pipeline/ops/commit.py.

Each job module supplies `prepare(config) -> plan` (with `generation`) and `build_pipeline(p, plan)`; the plan
gains its staging directory, the generation it started from and the filesystem options here.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Optional


from pipeline import job
from pipeline.beam_glue import FilesystemOptions, pipeline_options, s3_options_of
from pipeline.ops import guards, runlog, runners
from pipeline.ops.engines import submit
from pipeline.retrieval import store
from transforms.io.filesystem_options import set_filesystem_options
from pipeline.shard import cancel

LOG = logging.getLogger("pileprep.retrieval")


class StoreJob(job.Job):
    """A Beam job whose output is one retrieval store (kind, manifest format, prepare and graph given)."""

    exit_without_teardown = True  # its stages are not cancellable: see stop_workers

    def __init__(self, config, beam_args, kind: str, noun: str, manifest_format: str,
                 prepare: Callable, build_pipeline: Callable):
        self.config = config
        self.output = config.output
        self.kind, self.noun, self.manifest_format = kind, noun, manifest_format
        self._prepare, self._build_pipeline = prepare, build_pipeline
        self.options = pipeline_options(beam_args)
        self.log = runlog.RunLog(None)
        self.filesystem_options: Optional[FilesystemOptions] = None

    def describe(self) -> dict:
        return {"output": self.output, "kind": self.kind}

    def preflight(self) -> None:
        runners.preflight(self.options.get_all_options())
        set_filesystem_options(self.options)
        self.filesystem_options = FilesystemOptions.from_pipeline_options(self.options)
        self.config.validate()
        guards.check_local_writable(self.output, "--output")

    def s3_options(self) -> dict:
        return s3_options_of(self.filesystem_options)

    def staging_root(self) -> str:
        return guards.staging_root(self.output, None)

    def read_committed(self) -> Optional[dict]:
        return store.read_manifest(self.output, self.manifest_format)

    def live_generations(self, committed) -> set:
        generation = self.generation_of(committed) if committed else None
        return {generation} if generation else set()

    def plan(self, committed):
        plan = self._prepare(self.config)
        return dataclasses.replace(
            plan, filesystem_options=self.filesystem_options,
            staging_dir=guards.staging_dir_for(self.output, None, plan.generation),
            previous_generation=self.generation_of(committed) if committed else None)

    def decide(self, plan) -> job.Decision:
        if plan.previous_generation == plan.generation:
            return job.NothingToDo(f"nothing to do: {self.output} already holds {plan.generation}", plan.generation)
        return job.Build(plan.generation)

    def execute(self, plan):
        cancel.reset()
        p = submit.pipeline(self.options)  # the driver keeps its S3 credentials (submit.py)
        self._build_pipeline(p, plan)
        submit.wait_or_cancel(p.run(), p.options)

    def stop_workers(self) -> None:
        # The retrieval stages are not cancellable calls; this still silences Beam's in-process workers (their
        # abandoned bundles' errors) so an interrupt ends in one line. Files a worker thread writes after this
        # are the next run's cleanup (an unreferenced generation, removed under the lock).
        cancel.cancel_and_wait(timeout_s=5.0)
