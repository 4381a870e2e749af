"""The records the near-dedup stage's steps hand each other (pipeline/shard/near_dedup/transform.py), one type per
kind of element instead of string-tagged tuples: a step that gathers several kinds (the stage's last step, the
band index's tasks) tells them apart by type.

Every element travels through the runner's shuffle pickled (the Flattens' inputs are typed Any: one coder
for all, transform.py), so each is small: ids, names, a Node (transforms/shard/near_dedup/clusters.py, with its
400-byte signature), never a unit's rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from transforms.shard.near_dedup.clusters import Node


class DocRef(NamedTuple):
    """A distinct document the stage signs: where its Node comes from (one per document, so a tuple)."""
    doc_id: int
    split: int
    source: str
    loc: tuple[str | int, ...]  # (unit name, line) or, with staged shingles, (unit name, line, first shingle, count)


# --------------------------------------------------------------------------------- out of the signing step
@dataclass(frozen=True)
class UnitBands:
    """A unit whose band rows, signatures and documents are staged (band_files.py)."""
    unit_name: str


@dataclass(frozen=True)
class BandMember:
    """Runner shuffle: a document in the bucket of one band key."""
    key: int
    node: Node


@dataclass(frozen=True)
class Removal:
    """A document the stage removes, with its sidecar row (partitions.py writes it)."""
    doc_id: int
    row: dict[str, object]  # id, reason, source and the reason's own fields (keeper, jaccard / eval_file, ngram)


@dataclass(frozen=True)
class CommittedBandFile:
    """One committed generation's band index file of one key range, as its manifest row lists it, path resolved
    (committed.py checks the row; windows.py checks the bytes against it before using a row)."""
    generation: str
    rel: str  # the path the manifest lists, relative to the dataset
    range: int
    bytes: int
    sha256: str
    path: str


# ------------------------------------------------------------------------------------- the key-range tasks
@dataclass(frozen=True)
class RangeTask:
    """Files shuffle: find the edges of one band-key range among these units' band rows."""
    range: int
    unit_names: tuple[str, ...]


@dataclass(frozen=True)
class IndexTask:
    """Write one range of the generation's band index: these units' rows less the ids of the removal indexes."""
    range: int
    unit_names: tuple[str, ...]
    indexes: tuple[tuple[str, str], ...]  # (reason, path) of each removal index


# ---------------------------------------------------------------------------------- label propagation
@dataclass(frozen=True)
class NodeState:
    """A node of the graph between two rounds: its neighbours' ids, its label (the best Node it has heard of),
    and whether the last round changed the label."""
    node: Node
    neighbours: tuple[int, ...]  # their ids
    label: Node
    changed: bool = True


@dataclass(frozen=True)
class LabelOffer:
    """A neighbour's label, sent to a node for the next round."""
    label: Node


@dataclass(frozen=True)
class ClusterMember:
    """A node once the rounds are done: the keeper of its cluster (counted into cluster sizes)."""
    keeper_id: int


# ------------------------------------------------------------------------------- gathered by the last step
@dataclass(frozen=True)
class PartitionWritten:
    """One id partition's removals, written: its staged indexes and its sidecar."""
    partition: int
    indexes: tuple[tuple[str, str], ...]  # (reason, path) of each removal index
    sidecar: str
    examples: tuple[dict[str, object], ...]  # up to EXAMPLE_PAIRS near-duplicate rows, by id
    contaminated_examples: tuple[dict[str, object], ...]
    removed: dict[str, int]  # reason -> documents


@dataclass(frozen=True)
class ClusterSize:
    size: int


@dataclass(frozen=True)
class BandIndexWritten:
    """One range of the generation's band index, written."""
    range: int
    path: str
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Release:
    """A unit passed on to the packers once the removal indexes are staged."""
    unit: object  # transforms/shard/records.py UnitResult


@dataclass(frozen=True)
class Seed:
    """Makes the last step run when nothing is removed and no unit exists."""
