"""pipeline/tools/export_summary.py: an existing output's export.json is read and checked, never trusted (issue 32's
hostile review: a malformed one was a traceback, a user's own one was replaced, another format's export was
replaced, and a crafted `previous` made the export rmtree a user's directory)."""
from __future__ import annotations

import json
import os

import pytest

from pipeline.errors import ConfigError
from pipeline.tools import export_summary as es

GOOD = {"kind": "export", "format": "megatron", "generation": "gen-a", "previous": ["gen-0"],
        "files": [{"path": "gen-a/train_text_document.bin", "bytes": 1, "sha256": "0" * 64}]}


def _write(out, value) -> None:
    out.mkdir(exist_ok=True)
    data = value if isinstance(value, bytes) else json.dumps(value).encode()
    (out / "export.json").write_bytes(data)


def test_a_good_record_is_read_and_none_when_there_is_none(tmp_path):
    assert es.read_summary(str(tmp_path / "new")) is None
    _write(tmp_path / "out", GOOD)
    assert es.read_summary(str(tmp_path / "out")) == GOOD
    parquet = {"kind": "export", "format": "parquet", "generation": None, "files": [{"path": "train.parquet"}]}
    _write(tmp_path / "pq", parquet)  # a Parquet export of a dataset without generations
    assert es.read_summary(str(tmp_path / "pq")) == parquet


@pytest.mark.parametrize(("content", "problem"), [
    (b"{not json", "not readable JSON (JSONDecodeError"),
    (b"\xff\xfe", "not readable JSON (UnicodeDecodeError"),
    ([1, 2], 'not an export\'s record (no "kind": "export")'),
    ({"title": "my notes"}, 'not an export\'s record (no "kind": "export")'),  # a user's own export.json
    ({**GOOD, "format": "tfrecord"}, "format 'tfrecord' is not one of"),
    ({**GOOD, "generation": "../x"}, "generation '../x' is not a generation name"),
    ({**GOOD, "previous": "gen-0"}, 'previous "gen-0" is not a list of generation names'),
    ({**GOOD, "previous": ["../../home"]}, "is not a list of generation names"),
    ({**GOOD, "previous": ["/etc"]}, "is not a list of generation names"),
    ({**GOOD, "previous": [".."]}, "is not a list of generation names"),
    ({**GOOD, "files": {}}, "files is not a list"),
    ({**GOOD, "files": [{"path": "../secret"}]}, "a file path that leaves the output: '../secret'"),
    ({**GOOD, "by_source": "yes"}, "by_source is not true or false"),
])
def test_a_record_that_is_not_an_exports_is_refused_by_name_in_one_line(tmp_path, content, problem):
    out = tmp_path / "out"
    _write(out, content)
    with pytest.raises(ConfigError) as e:
        es.read_summary(str(out))
    message = str(e.value)
    assert message.startswith(f"{out / 'export.json'}: ") and problem in message and "\n" not in message, message


def test_a_directory_named_export_json_is_refused(tmp_path):
    (tmp_path / "export.json").mkdir()
    with pytest.raises(ConfigError, match="export.json: a directory"):
        es.read_summary(str(tmp_path))


def test_one_output_holds_one_format(tmp_path):
    _write(tmp_path, GOOD)
    assert es.check_same_export(str(tmp_path), "megatron") == GOOD
    with pytest.raises(ConfigError, match=r"holds a megatron export; a parquet export goes to its own directory"):
        es.check_same_export(str(tmp_path), "parquet")
    with pytest.raises(ConfigError, match="holds an export without --by-source"):
        es.check_same_export(str(tmp_path), "megatron", by_source=True)


def test_a_killed_export_of_another_format_is_not_taken_over(tmp_path):
    es.write_marker(str(tmp_path), "megatron")
    assert es.check_same_export(str(tmp_path), "megatron") is None
    with pytest.raises(ConfigError, match="holds a killed megatron export"):
        es.check_same_export(str(tmp_path), "parquet")
    (tmp_path / es.IN_PROGRESS_MARKER).write_bytes(b"")  # an export's from before the marker named its format
    assert es.check_same_export(str(tmp_path), "parquet") is None


def test_only_a_stamped_real_directory_is_an_exports_generation(tmp_path):
    made = tmp_path / "gen-a"
    made.mkdir()
    es.stamp_generation(str(made))
    (tmp_path / "mine").mkdir()  # a user's directory: no stamp
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    es.stamp_generation(str(elsewhere))
    os.symlink(elsewhere, tmp_path / "linked")  # a link to a stamped directory: never followed
    (tmp_path / "stamp-link").mkdir()
    os.symlink(made / es.GENERATION_STAMP, tmp_path / "stamp-link" / es.GENERATION_STAMP)
    out = str(tmp_path)
    assert es.own_generation(out, "gen-a")
    assert not any(es.own_generation(out, n) for n in ("mine", "linked", "stamp-link", "missing", "..", "gen-a/..",
                                                       f"../{elsewhere.name}"))
