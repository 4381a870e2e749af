"""Where every file a shard run writes lives, named once: in the run's staging directory (chunks, units, signatures,
kept ids, the held-out id lists) or in its partial generation (dead letters, shards, the generation's id index).

The driver's bookkeeping files in staging (markers, failed-backend records, input digests) are named here too.
A name is a `Placed(root, rel)`: which of the two roots and the path below it. Completion markers list their
files in that form (pipeline/shard/markers.py), so a marker never holds a full path; `Layout(staging_dir,
data_dir).path(placed)` makes the full one. File names depend only on the input and the config, so a retried
bundle rewrites identical bytes (Beam may run a bundle twice).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

from transforms.io import io_utils

STAGING, DATA = "staging", "data"  # the two roots
GENERATION_ID_INDEX = "doc-ids.idx"


class Placed(NamedTuple):
    root: str  # STAGING or DATA
    rel: str


def unit_name_of(file_idx: int, chunk_idx: int) -> str:
    """The name of a file's chunk and of the unit tokenized from it."""
    return f"f{file_idx:06d}-c{chunk_idx:05d}"


def _named(root: str, template: str) -> Callable[..., Placed]:
    return lambda *name: Placed(root, template.format(*name))


# In staging, by unit name (f<file>-c<chunk>), shard file name or split name
chunk_file = _named(STAGING, "chunks/{}.rec.zst")  # a spilled chunk (transforms/shard/cut.py cut_input_file)
unit_index = _named(STAGING, "units/{}.index")  # a unit's index rows (transforms/shard/tokenize_unit.py)
unit_tokens = _named(STAGING, "units/{}.tokens")  # ... and its tokens
# a unit's near-dedup signatures, when the tokenize stage signs (tokenize_unit.py TokenizeSettings.near_dedup_params)
unit_signatures = _named(STAGING, "near-dedup/unit-signatures/{}.sigs")
held_out_ids = _named(STAGING, "dedup/{}.ids")  # a held-out split's sorted ids (exact_dedup.py index_held_out_ids)
shard_ids = _named(STAGING, "ids/{}.ids")  # the ids a packed shard kept (merged into the id index at the commit)
unit_list = _named(STAGING, "units.pickle")  # the sorted units every pack task reads (pipeline/shard/graph.py)
DONE_DIR, FAILED_BACKENDS_DIR = "done", "failed-backends"
marker = _named(STAGING, DONE_DIR + "/{}.json")  # a completion marker, by its name (pipeline/shard/markers.py)
failed_backend = _named(STAGING, FAILED_BACKENDS_DIR + "/{}.json")  # by key hash (pipeline/shard/markers.py)
input_digest = _named(STAGING, "inputs/f{:06d}.json")  # by file_idx (pipeline/shard/input_digests.py)
# In the partial generation
cut_dead_letters = _named(DATA, "dead_letter/f{:06d}-read.jsonl")  # by file_idx: damage found while cutting
unit_dead_letters = _named(DATA, "dead_letter/{}.jsonl")  # by unit name: records the tokenize stage refused
shard_file = _named(DATA, "{}")  # by shard file name (transforms/shard/records.py ShardTask.file_name)
generation_id_index = _named(DATA, GENERATION_ID_INDEX)


@dataclass(frozen=True)
class Layout:
    """One run's two roots: its staging directory and its partial generation."""
    staging_dir: str
    data_dir: str

    def path(self, placed: Placed) -> str:
        return io_utils.join(self.staging_dir if placed.root == STAGING else self.data_dir, placed.rel)
