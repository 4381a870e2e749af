"""Beam wiring of the runner's shuffle (docs/SHUFFLE.md, design D; the work is in transforms/shard/shard_shuffle.py).

    units (gathered) → PlanPieces: one element per unit, each with the shard plan, plus one for the markers
                     → EmitPieces: reads a unit twice (index, tokens), yields ((split, shard), piece)
                     → GroupByKey: the runner moves and spills the pieces
                     → PackGroupedShard: one shard from its pieces, same packer and bytes as the file spill

Chosen by `--shuffle` (pipeline/ops/runners.py: choose_shuffle); the file spill stays in shard_pipeline.py.
"""
from __future__ import annotations

from apache_beam.metrics import Metrics

from pipeline.beam_glue import PlanDoFn
from pipeline.shard import cancel
from pipeline.shard.stage_dofn import PackStage
from transforms.shard import shard_shuffle
from transforms.shard.records import ShardResult, ShardTask


def unit_elements(units: list, tasks: list, dedup) -> list:
    """(unit or None, plan) per unit with documents, and one (None, plan) that sends every shard its marker."""
    plan = shard_shuffle.ShardPlan.from_tasks(tasks, dedup)
    return [(None, plan)] + [(unit, plan) for unit in units if unit.n_docs]


def element_key(element) -> str:
    unit, _plan = element
    return "" if unit is None else unit.name


def _cut(unit, shard_plan) -> list:
    index, tokens = shard_shuffle.read_unit(unit)
    return list(shard_shuffle.cut_unit(unit, index, tokens, shard_plan))


class EmitPieces(PlanDoFn):
    """One unit → its per-shard pieces (or, for the marker element, every shard's marker)."""

    def __init__(self, plan):
        super().__init__(plan)
        self.pieces = Metrics.counter("pileprep", "shuffle_pieces")

    def process(self, element):
        unit, shard_plan = element
        if unit is None:
            yield from shard_shuffle.markers(shard_plan)
            return
        pieces = cancel.call(_cut, unit, shard_plan)  # None: the driver cancelled the run (cancel.py)
        for keyed in pieces or ():
            self.pieces.inc()
            yield keyed


class PackGroupedShard(PackStage):
    """One shard from its grouped pieces: the file spill's packer (transforms/shard/pack.py pack_shard) given the
    merged rows; reused, marked and counted as the file spill's (pipeline/shard/stage_dofn.py PackStage)."""

    def process(self, key_and_values):
        yield from super().process(shard_shuffle.gather_pieces(*key_and_values))

    def task_of(self, element) -> ShardTask:
        return element[0]

    def compute(self, element) -> ShardResult:
        task, dedup, pieces, gathered = element
        return self.pack(task, pieces, dedup, gathered)
