"""docs/DESIGN.md's rooms table says what tests/unit/house/test_rooms.py enforces: the table in words is parsed
and compared with the test's ALLOWED, so neither can change alone (issue 29: "the rooms table stays enforced by
the house tests")."""
from __future__ import annotations

import pathlib
import re

from tests.conftest import REPO
from tests.unit.house.test_rooms import ALLOWED, OPS_INTO_SHARD, TRANSFORMS

PIPELINE_ROOMS = {room for room in ALLOWED if room.split("/")[0] == "pipeline"}


def table_lines(design: str) -> list:
    """The lines of the code block under DESIGN.md's "### Rooms" heading."""
    section = design.split("### Rooms", 1)[1]
    return section.split("```", 2)[1].strip("\n").splitlines()


def room_name(words: str) -> str:
    """`pipeline/ (top)` -> pipeline, `transforms/io/` -> transforms/io."""
    return re.sub(r"\s*\(.*?\)", "", words).strip().rstrip("/")


def imported_rooms(words: str) -> tuple:
    """(rooms, the pipeline/shard modules named for pipeline/ops) from the words after `imports:`."""
    rooms, ops_modules = set(), set()
    for item in (part.strip() for part in re.split(r",(?![^()]*\))", words)):  # commas outside parentheses
        note = re.search(r"\((.*?)\)", item)
        name = room_name(item).removesuffix(" only")
        if name in ("nothing of pileprep", ""):
            continue
        if name == "any pipeline room":
            rooms |= PIPELINE_ROOMS
        elif name == "transforms":
            rooms |= TRANSFORMS
        else:
            rooms.add(name)
            if name == "pipeline/shard" and note:
                ops_modules = {f"pipeline.shard.{m.strip()}" for m in note.group(1).split(",")}
    return rooms, ops_modules


def parse_table(design: str) -> tuple:
    """{room: rooms it may import} and the pipeline/shard modules pipeline/ops may import, from the table."""
    allowed, ops_modules = {}, set()
    for line in table_lines(design):
        if "imports:" not in line:
            continue  # a description's second line
        head, words = line.split("imports:", 1)
        room = room_name(re.split(r"\s{2,}", head.strip())[0])
        rooms, named = imported_rooms(words)
        allowed[room] = rooms - {room}
        if room == "pipeline/ops":
            ops_modules = named
    return allowed, ops_modules


def test_the_design_table_is_the_enforced_table():
    allowed, ops_modules = parse_table((pathlib.Path(REPO) / "docs" / "DESIGN.md").read_text(encoding="utf-8"))
    assert allowed == ALLOWED
    assert ops_modules == OPS_INTO_SHARD


def test_a_table_that_drifts_is_caught():
    design = ("### Rooms\n```\n"
              "model_contract/   the contract       imports: nothing of pileprep\n"
              "trainer/          the trainer        imports: model_contract, transforms/io\n"
              "pipeline/ops/     commit, lock,      imports: pipeline (top), pipeline/shard (integrity, plan)\n"
              "                  runners\n```\n")
    allowed, ops_modules = parse_table(design)
    assert allowed == {"model_contract": set(), "trainer": {"model_contract", "transforms/io"},
                       "pipeline/ops": {"pipeline", "pipeline/shard"}}
    assert allowed["trainer"] != ALLOWED["trainer"]
    assert ops_modules == {"pipeline.shard.integrity", "pipeline.shard.plan"} != OPS_INTO_SHARD
