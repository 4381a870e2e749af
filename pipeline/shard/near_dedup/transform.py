"""The near-dedup and decontamination stage of the shard job, between tokenize and pack: one PTransform.

    units ─ SignUnit ─┬─ band keys ─ GroupByKey ─ star edges [─ verify] ─ adjacency ─ R label rounds ─┐
                      └─ contaminated rows ──────────────────────────────────────────────── removals ─┤
                                                             GroupByKey by id partition: write indexes ┘
    then a barrier: the units pass on only once the removal indexes are staged (packing reads them).

Candidate pairs meet in the runner's own GroupByKey on band keys (`--shuffle runner`), or in key-range tasks
over staged band files (`files`, edges.py); the union-find is label propagation over a fixed number of rounds
unrolled into the graph (labels.py). Elements are small typed records (elements.py). Every name and every
choice depends only on the data, never on placement or arrival order, so the output is the same bytes on every
runner. The pure logic is in transforms/shard/near_dedup/ and transforms/shard/decontaminate.py.
"""
from __future__ import annotations

import typing

import apache_beam as beam

from pipeline.shard.near_dedup import committed as committed_files
from pipeline.shard.near_dedup import eval_sets, partitions
from pipeline.shard.near_dedup.band_index_writer import band_index_tasks, write_band_index_range
from pipeline.shard.near_dedup.edges import range_edges, verify
from pipeline.shard.near_dedup.elements import (BandMember, ClusterMember, ClusterSize, RangeTask, Release,
                                                Removal, Seed, UnitBands)
from pipeline.shard.near_dedup.labels import propagate_labels
from pipeline.shard.near_dedup.sign import SignUnit
from pipeline.shard.near_dedup.windows import committed_range_rows
from transforms.shard.near_dedup import clusters, removals
from transforms.shard.near_dedup.band_index import BAND_RANGES


class NearDedup(beam.PTransform):
    """units → the same units, released once the removal indexes are staged (see the module docstring)."""

    def __init__(self, plan, shuffle: str = "runner"):
        super().__init__()
        self.plan = plan
        self.shuffle = shuffle  # 'runner' (GroupByKey on band keys) or 'files' (staged band files, key ranges)
        cfg = plan.config
        self.eval_paths = tuple(eval_sets.eval_files(cfg)) if cfg.decontaminate_config.enabled else ()
        # --incremental: new documents meet the committed generations' kept documents in the band buckets
        self.committed = (tuple(committed_files.committed_band_indexes(plan.previous, cfg.output,
                                                                       cfg.near_dedup_config.shingles))
                          if plan.incremental and cfg.near_dedup_config.enabled else ())

    def expand(self, units):
        plan, near = self.plan, self.plan.config.near_dedup_config
        signed = units | "NDSign" >> beam.ParDo(SignUnit(plan, self.eval_paths, self.shuffle))
        rows = [signed | "NDContaminated" >> beam.Filter(isinstance, Removal)]
        ends = []  # what the last step gathers besides the partitions: cluster sizes, band index files
        if near.enabled:
            edges = self._files_edges(signed) if self.shuffle == "files" else self._runner_edges(signed, units)
            if near.verify:
                edges = edges | "NDVerify" >> beam.FlatMap(verify, plan)
            final = propagate_labels(edges, near.rounds)
            rows.append(final | "NDNearRows" >> beam.Filter(isinstance, Removal))
            ends.append(final
                        | "NDKeepers" >> beam.FlatMap(lambda e: [e.keeper_id] if isinstance(e, ClusterMember) else [])
                        | "NDClusterSize" >> beam.combiners.Count.PerElement()
                        | "NDSizes" >> beam.Map(lambda kv: ClusterSize(kv[1])).with_output_types(typing.Any))
        partitions_written = (tuple(rows) | "NDRows" >> beam.Flatten()
                              | "NDByPartition" >> beam.Map(lambda e: (removals.partition_of(e.doc_id), e.row))
                              | "NDGroupPartitions" >> beam.GroupByKey()
                              | "NDWritePartition" >> beam.Map(partitions.write_partition, plan)
                              .with_output_types(typing.Any))
        if near.enabled:  # the generation's band index, of the documents it keeps: after the removals
            ends.append(self._band_index(signed, partitions_written))
        # One gather for the stage's end and the barrier: the units pass on from the step that staged the
        # removal indexes, so no packer can start before they exist (the seed makes the step run when
        # nothing at all is removed and no unit exists).
        # Every input of a Flatten is typed Any: inferred types give the inputs different coders, and a runner
        # that fuses a Flatten's consumer decodes every input with one of them (FnApiRunner with worker threads
        # failed "Invalid PaneInfoEncoding" on an inferred Tuple[str, None] coder).
        seed = units.pipeline | "NDSeed" >> beam.Create([Seed()]).with_output_types(typing.Any)
        released = units | "NDTagUnits" >> beam.Map(Release).with_output_types(typing.Any)
        return ((released, partitions_written, seed, *ends)
                | "NDGatherParts" >> beam.Flatten()
                | "NDCollect" >> GatherAll()
                | "NDFinishAndRelease" >> beam.FlatMap(partitions.finish_and_release, plan))

    def _files_edges(self, signed):
        """Files shuffle: one task per band-key range over every unit's staged band rows (edges.py)."""
        return (signed
                | "NDBandFiles" >> beam.FlatMap(lambda e: [e.unit_name] if isinstance(e, UnitBands) else [])
                | "NDCollectBandFiles" >> GatherAll()
                | "NDRanges" >> beam.FlatMap(lambda names: [RangeTask(r, tuple(sorted(names)))
                                                            for r in range(BAND_RANGES)])
                | "NDKeyRanges" >> beam.Map(lambda t: (t.range, t))  # a GroupByKey spreads them on every
                | "NDSpreadRanges" >> beam.GroupByKey()  # runner (Reshuffle is a no-op on DaskRunner)
                | "NDRangeTasks" >> beam.FlatMap(lambda kv: kv[1])
                | "NDEdges" >> beam.FlatMap(range_edges, self.plan, self.committed))

    def _runner_edges(self, signed, units):
        """Runner shuffle: documents meet in the runner's GroupByKey on band keys (and, incrementally, the
        committed band index rows, one element per committed file, read where it lands)."""
        near = self.plan.config.near_dedup_config
        bands = [signed | "NDBands" >> beam.FlatMap(lambda e: [(e.key, e.node)] if isinstance(e, BandMember)
                                                    else []).with_output_types(typing.Any)]
        if self.committed:
            bands.append(units.pipeline
                         | "NDCommittedFiles" >> beam.Create(list(self.committed))
                         | "NDCommittedRows" >> beam.FlatMap(committed_range_rows, near.params.num_perm)
                         .with_output_types(typing.Any))
        return (tuple(bands) | "NDAllBands" >> beam.Flatten()
                | "NDGroupBands" >> beam.GroupByKey()
                | "NDEdges" >> beam.FlatMap(lambda kv, t: clusters.bucket_edges(kv[1], t), near.threshold))

    def _band_index(self, signed, partitions_written):
        """The generation's band index files: one task per key range once every removal partition is written."""
        names = signed | "NDIndexNames" >> beam.Filter(isinstance, UnitBands).with_output_types(typing.Any)
        return ((names, partitions_written) | "NDIndexInputs" >> beam.Flatten()
                | "NDIndexGather" >> GatherAll()
                | "NDIndexTasks" >> beam.FlatMap(band_index_tasks)
                | "NDIndexKeys" >> beam.Map(lambda t: (t.range, t))
                | "NDSpreadIndex" >> beam.GroupByKey()
                | "NDIndexTask" >> beam.FlatMap(lambda kv: kv[1])
                | "NDWriteIndex" >> beam.Map(write_band_index_range, self.plan).with_output_types(typing.Any))


class GatherAll(beam.PTransform):
    """A PCollection → one element: the list of all its elements (one key, one GroupByKey)."""

    def expand(self, pcoll):
        return (pcoll
                | "OneKey" >> beam.Map(lambda x: (0, x))
                | "Group" >> beam.GroupByKey()
                | "List" >> beam.Map(lambda kv: list(kv[1])))
