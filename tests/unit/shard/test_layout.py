"""transforms/shard/layout.py: every file a shard run writes is named once, below one of two roots (staging, the
partial generation); markers hold only the (root, rel) form and `Layout.path` makes the full path."""
from __future__ import annotations

from transforms.shard import layout


def test_names_depend_only_on_their_arguments_and_each_root_is_its_own():
    assert layout.unit_name_of(3, 17) == "f000003-c00017"
    unit = layout.unit_name_of(3, 17)
    assert layout.unit_tokens(unit) == layout.Placed(layout.STAGING, "units/f000003-c00017.tokens")
    assert layout.cut_dead_letters(3) == layout.Placed(layout.DATA, "dead_letter/f000003-read.jsonl")
    assert layout.input_digest(3).rel == "inputs/f000003.json"
    assert layout.generation_id_index().rel == layout.GENERATION_ID_INDEX
    where = layout.Layout("/s/stage", "/o/gen-1")
    assert where.path(layout.unit_tokens(unit)) == "/s/stage/units/f000003-c00017.tokens"
    assert where.path(layout.shard_file("train-00000-of-00001.tfrecord")) == "/o/gen-1/train-00000-of-00001.tfrecord"


def test_no_two_kinds_of_file_share_a_name():
    """Distinct staging files of one unit and of one file (a clash would overwrite a stage's output)."""
    unit = layout.unit_name_of(0, 0)
    named = [layout.chunk_file(unit), layout.unit_index(unit), layout.unit_tokens(unit),
             layout.unit_signatures(unit), layout.held_out_ids("val"), layout.shard_ids(unit), layout.unit_list(),
             layout.marker(unit), layout.failed_backend(unit), layout.input_digest(0), layout.cut_dead_letters(0),
             layout.unit_dead_letters(unit), layout.generation_id_index()]
    assert len(set(named)) == len(named)
    assert all(not p.rel.startswith("/") for p in named)  # never a full path in a marker
