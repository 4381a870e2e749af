"""The shard job's Beam graph, read top to bottom: ledger -> chunks -> units -> [near-dedup] -> shards -> commit.

    BuildShards(plan)
      ListInputs        the plan's ledger, one element per input file (file_idx, path, chunk_bytes)
      Units             CutIntoChunks + Tokenize, or CutAndTokenize in one worker  -> UnitResult
      NearDedup         (--near-dedup) pipeline/shard/near_dedup/transform.py    -> UnitResult
      PackShards        the file spill or the runner's shuffle (docs/SHUFFLE.md)  -> ShardResult
      Commit            every stage's results in one element -> the committed manifest (a dict)

Each stage's DoFn is pipeline/shard/stage_dofn.py (reuse or compute, mark, count), its work a pure function in
transforms/shard/ (cut.py, tokenize_unit.py, exact_dedup.py, pack.py), the records they hand each other
transforms/shard/records.py; the commit's manifest is pipeline/shard/manifest_builder.py manifest_for. Bulk data
moves through files in the staging directory, elements are small descriptors, and every name and order is
derived from the input and config, so the output is byte-identical whatever the runner or the number of workers.

The graph has no side inputs and no multi-output steps, and its one sink (the commit) depends on every stage
through main inputs: the same graph then runs each stage exactly once on every runner, FnApiRunner, the portable
runner, Dataflow/Flink/Spark and DaskRunner alike (which computes only the last step's graph and recomputes side
inputs per consumer).
"""
from __future__ import annotations

import dataclasses
import logging
import pickle

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.beam_glue import GatherAll, Spread, apply_filesystem_options
from pipeline.ops import commit, runners
from pipeline.shard import manifest_builder, runner_shuffle, unit_plan
from pipeline.shard.near_dedup import settings as near_dedup_settings
from pipeline.shard.near_dedup.transform import NearDedup
from pipeline.shard.plan import JobPlan
from pipeline.shard.stage_dofn import CutAndTokenizeFile, CutInputFile, PackShard, TokenizeChunk
from transforms.io import io_utils
from transforms.shard import exact_dedup, layout
from transforms.shard.layout import Layout
from transforms.shard.records import CommitParts, UnitResult

LOG = logging.getLogger("pileprep.shard")


class BuildShards(beam.PTransform):
    """The shard job on a pipeline's root: the committed manifest (a dict) as its one element.

    `spread_chunks`: give one file's chunks a redistribution step of their own (`spread_chunks_needed`);
    `shuffle`: 'files' or 'runner' (`shuffle_for`), how documents reach their shard. Output bytes are the same
    either way."""

    def __init__(self, plan: JobPlan, spread_chunks: bool = True, shuffle: str = "files"):
        super().__init__()
        self.plan, self.spread_chunks, self.shuffle = plan, spread_chunks, shuffle

    def expand(self, root):
        plan = self.plan
        # Planned once here, on the driver, from the ledger and --unit-mb only (pipeline/shard/unit_plan.py)
        chunk_bytes = unit_plan.chunk_bytes_for(plan.ledger, plan.config.unit_bytes)
        files = root | "ListInputs" >> beam.Create([(i, e.path, chunk_bytes) for i, e in enumerate(plan.ledger)])
        cuts, units = files | "Units" >> CutAndTokenize(plan, self.spread_chunks)
        # After tokenize (exact dedup is by id), before packing and repeats; left out when an earlier run of this
        # generation finished it (its marker checked with every file's sha256: pipeline/shard/markers.py), since
        # the removals it staged depend only on the fingerprint.
        if near_dedup_settings.enabled(plan.config) and not plan.resumed_near_dedup:
            units = units | "NearDedup" >> NearDedup(plan, self.shuffle)
        shards = units | "PackShards" >> PackShards(plan, self.shuffle)
        return ((cuts, units, shards)  # told apart by type at the commit (transforms/shard/records.py CommitParts)
                | "GatherForCommit" >> beam.Flatten()
                | "CollectForCommit" >> GatherAll()
                | "CommitManifest" >> beam.Map(commit_generation, plan))


class CutAndTokenize(beam.PTransform):
    """Input files -> (their CutOutputs, the units of their chunks).

    The chunks go through staging where other workers tokenize them (`spread_chunks`), or where the near-dedup
    stage reads them again; else each file's chunks are tokenized by the worker that cuts them, as they are cut
    (pipeline/shard/stage_dofn.py CutAndTokenizeFile: same units, names and bytes)."""

    def __init__(self, plan: JobPlan, spread_chunks: bool):
        super().__init__()
        self.plan, self.spread_chunks = plan, spread_chunks

    def expand(self, files):
        files = files | "SpreadFiles" >> Spread(lambda f: f[0])
        if self.spread_chunks or near_dedup_settings.enabled(self.plan.config):
            cuts = files | "CutIntoChunks" >> beam.ParDo(CutInputFile(self.plan))
            chunks = cuts | "Chunks" >> beam.FlatMap(lambda c: c.result.chunks)
            if self.spread_chunks:
                chunks = chunks | "SpreadChunks" >> Spread(lambda c: (c.file_idx, c.chunk_idx))
            return cuts, chunks | "Tokenize" >> beam.ParDo(TokenizeChunk(self.plan))
        tokenized = files | "CutAndTokenize" >> beam.ParDo(CutAndTokenizeFile(self.plan))
        return (tokenized | "Cuts" >> beam.Map(lambda t: t.cut),
                tokenized | "UnitsOfFiles" >> beam.FlatMap(lambda t: t.units))


class PackShards(beam.PTransform):
    """Units -> packed shards, once every unit is in (the shard plan and the held-out ids need them all).

    'files': each pack task reads its key range from every unit's spill files (the units listed once in staging);
    'runner': each unit is cut into per-shard pieces that the runner's GroupByKey moves
    (pipeline/shard/runner_shuffle.py). Same packer, same bytes."""

    def __init__(self, plan: JobPlan, shuffle: str):
        super().__init__()
        self.plan, self.shuffle = plan, shuffle

    def expand(self, units):
        gathered = units | "CollectUnits" >> GatherAll()
        if self.shuffle == "runner":
            return (gathered
                    | "PlanPieces" >> beam.FlatMap(_unit_elements, self.plan)
                    | "SpreadUnits" >> Spread(runner_shuffle.element_key)
                    | "EmitPieces" >> beam.ParDo(runner_shuffle.EmitPieces(self.plan))
                    | "GroupPieces" >> beam.GroupByKey()
                    | "PackShards" >> beam.ParDo(runner_shuffle.PackGroupedShard(self.plan)))
        return (gathered
                | "PlanShards" >> beam.FlatMap(_pack_tasks, self.plan)
                | "SpreadShards" >> Spread(lambda tu: (tu[0].split, tu[0].shard))
                | "PackShards" >> beam.ParDo(PackShard(self.plan)))


def _units_tasks_dedup(units: list[UnitResult], plan: JobPlan) -> tuple:
    """(sorted units, shard tasks, dedup inputs): what both shuffles plan from the tokenized units."""
    apply_filesystem_options(plan.filesystem_options)
    units = sorted(units, key=lambda u: u.name)
    # Cross-split dedup needs every held-out id before any shard is packed: one global pass over the units'
    # (small) held-out key ranges here, where all units meet; packers skip ids a winning split or a committed
    # generation holds (transforms/shard/records.py DedupInputs: a few paths, cheap to carry in every task).
    dedup = dataclasses.replace(exact_dedup.index_held_out_ids(units, plan.staging_dir),
                                committed=plan.committed_id_indexes)
    return units, manifest_builder.shard_write_tasks(units, plan.config), dedup


def _pack_tasks(units: list[UnitResult], plan: JobPlan) -> list:
    """[(shard task, staged unit list path, dedup inputs)]: one element per shard for PackShard. The sorted
    unit list is staged once; each pack task carries only its path.

    Carrying the list in every task would move units × shards descriptors through the shuffle; a side input
    would be rebuilt per consumer on some runners. One staged file, read once per worker, does neither.
    """
    units, tasks, dedup = _units_tasks_dedup(units, plan)
    path = Layout(plan.staging_dir, plan.data_dir).path(layout.unit_list())
    io_utils.write_bytes(path, pickle.dumps(units, protocol=pickle.HIGHEST_PROTOCOL))
    return [(task, path, dedup) for task in tasks]


def _unit_elements(units: list[UnitResult], plan: JobPlan) -> list:
    """The runner's shuffle: one element per unit carrying the shard plan (runner_shuffle.unit_elements)."""
    return runner_shuffle.unit_elements(*_units_tasks_dedup(units, plan))


def commit_generation(grouped: list, plan: JobPlan) -> dict:
    """The commit point: every stage's results in one element -> the manifest, complete
    (pipeline/shard/manifest_builder.py manifest_for), committed (pipeline/ops/commit.py)."""
    apply_filesystem_options(plan.filesystem_options)
    manifest = manifest_builder.manifest_for(plan, CommitParts.gather(grouped))
    previous = plan.previous
    commit.commit_dataset(plan.config.output, manifest, None if previous is None else previous.generation,
                          plan.staging_dir, previous, plan.config.keep_generations)
    return manifest.to_dict()


# ------------------------------------------------------------------------------- the graph's two choices
def shuffle_for(p: beam.Pipeline, plan: JobPlan) -> str:
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
