"""pipeline/shard/markers.py on its own: marker names, writing a completion marker and reading it back, and the
checks that refuse a marker that is not this run's or whose files were changed (resume's use of them:
tests/unit/shard/test_resume.py)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pipeline.shard import markers
from transforms.io import io_utils
from transforms.shard import records
from transforms.shard.records import BadRecord, CutOutput, InputFile, LedgerEntry

GEN = "gen-" + "3" * 16


def _plan(tmp_path, generation=GEN):
    inp = str(tmp_path / "in.jsonl")
    return SimpleNamespace(config=SimpleNamespace(output=str(tmp_path / "out"), staging_dir=None),
                           generation=generation, staging_dir=str(tmp_path / "staging"),
                           data_dir=str(tmp_path / "out" / generation), ledger=[LedgerEntry(inp, 10)])


def _marked_cut(plan):
    """A cut of input file 0 with one spilled chunk file, and its marker."""
    inp = plan.ledger[0].path
    chunk = io_utils.join(plan.staging_dir, "chunks", "f000000-c00000.rec.zst")
    io_utils.write_bytes(chunk, b"chunk bytes")
    cut = CutOutput(records.CutResult(0, inp, [records.ChunkRef(0, inp, 0, chunk, 3, 11)], records.FileStats(3),
                                      None), InputFile(inp, 10, sha256="0" * 64))
    markers.mark_cut(plan, cut)
    return cut, chunk


def test_marker_names_depend_only_on_the_work_and_only_marker_names_are_listed(tmp_path):
    assert markers.cut_marker_name(3) == "cut-f000003"
    assert markers.unit_marker_name("f000003-c00012") == "unit-f000003-c00012"
    assert markers.marker_path("/s", "cut-f000003") == "/s/done/cut-f000003.json"
    plan = _plan(tmp_path)
    assert markers.marker_names(plan.staging_dir) == []  # no staging yet: none
    _marked_cut(plan)
    io_utils.write_bytes(markers.marker_path(plan.staging_dir, "notes"), b"{}")  # not a marker's name
    assert markers.marker_names(plan.staging_dir) == ["cut-f000000"]


def test_a_written_marker_records_its_files_and_reads_back_as_the_same_result(tmp_path):
    plan = _plan(tmp_path)
    cut, chunk = _marked_cut(plan)
    marker = json.loads(io_utils.read_bytes(markers.marker_path(plan.staging_dir, "cut-f000000")))
    assert marker["fingerprint"] == GEN and marker["name"] == "cut-f000000" and "backend" not in marker
    (row,) = marker["files"]
    assert row["bytes"] == len(b"chunk bytes") and markers.file_path(plan, row) == chunk
    assert markers.check_marker(plan, "cut-f000000", hashes=True) == marker
    assert markers.load_cut(plan, 0) == cut


@pytest.mark.parametrize("field,value,reason", [
    ("fingerprint", "gen-" + "9" * 16, "is not this run's"),
    ("name", "cut-f000001", "does not match its file name"),
    ("result", None, "not a marker"),
])
def test_a_tampered_marker_is_refused_with_its_reason(tmp_path, field, value, reason):
    plan = _plan(tmp_path)
    _marked_cut(plan)
    path = markers.marker_path(plan.staging_dir, "cut-f000000")
    marker = json.loads(io_utils.read_bytes(path))
    marker[field] = value
    io_utils.write_bytes(path, json.dumps(marker).encode())
    with pytest.raises(BadRecord, match=reason):
        markers.check_marker(plan, "cut-f000000")


def test_a_marker_of_an_input_not_in_this_runs_ledger_is_refused(tmp_path):
    plan = _plan(tmp_path)
    _marked_cut(plan)
    other = dict(vars(plan), ledger=[LedgerEntry(str(tmp_path / "other.jsonl"), 10)])
    with pytest.raises(BadRecord, match="ledger"):
        markers.check_marker(SimpleNamespace(**other), "cut-f000000")


def test_a_changed_file_is_refused_by_size_and_same_size_other_bytes_by_sha256(tmp_path):
    plan = _plan(tmp_path)
    _, chunk = _marked_cut(plan)
    io_utils.write_bytes(chunk, b"chunk BYTES")  # same size
    assert markers.check_marker(plan, "cut-f000000")  # the driver's size-only check passes it
    with pytest.raises(BadRecord):
        markers.check_marker(plan, "cut-f000000", hashes=True)
    assert markers.load_cut(plan, 0) is None  # the worker's check: refused, and the marker deleted
    assert not io_utils.exists(markers.marker_path(plan.staging_dir, "cut-f000000"))
    _marked_cut(plan)
    io_utils.write_bytes(chunk, b"longer chunk bytes")
    with pytest.raises(BadRecord):
        markers.check_marker(plan, "cut-f000000")
