"""pipeline/tools/report_data.py on its own: the report's figures from tiny hand-written manifests, metrics and run
logs (the page from a real shard run: tests/e2e/test_report.py)."""
from __future__ import annotations

import json

import pytest

from pipeline.tools import report_data


def _manifest():
    return {"splits": {"train": {"tokens": 30}, "val": {"tokens": 10}},
            "sources": {"arXiv": {"train": {"tokens": 10}, "val": {"tokens": 10}},
                        "Pile-CC": {"train": {"tokens": 20}}},
            "shards": [{"bytes": 100}, {"bytes": 50}], "doc_id_indexes": [{"bytes": 7}],
            "dead_letter_files": [{"bytes": True}, "not a row"]}


def test_num_keeps_finite_numbers_only():
    assert [report_data.num(v) for v in (3, 2.5, True, float("nan"), float("inf"), "9", None)] == [3, 2.5, 0, 0, 0,
                                                                                                   0, 0]


def test_bytes_on_disk_sums_the_listed_files_and_ignores_what_is_not_a_size():
    assert report_data.bytes_on_disk(_manifest()) == 157
    assert report_data._bytes(157) == "157 B" and report_data._bytes(3 * 1024 ** 2) == "3.00 MiB"


def test_split_shares_are_percent_of_each_splits_tokens():
    assert report_data.split_shares(_manifest()) == {"train": {"arXiv": pytest.approx(100 / 3), "Pile-CC":
                                                               pytest.approx(200 / 3)},
                                                     "val": {"arXiv": 100.0, "Pile-CC": 0.0}}


def test_dedup_rows_give_the_share_dropped_and_na_for_a_source_with_no_documents():
    rows = report_data.dedup_rows({"b": {"tokenized_documents": 8, "duplicates": 2}, "a": {}})
    assert rows == [["a", 0, 0, "n/a"], ["b", 8, 2, "25.00%"]]


def test_metrics_keep_lines_with_a_step_and_a_finite_loss_in_step_order(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join([json.dumps({"step": 2, "loss": 1.0}), "not json", json.dumps({"step": 1, "loss": 2.0}),
                               '{"step": 3, "loss": NaN}', json.dumps({"loss": 1.0})]))
    assert [r["step"] for r in report_data.read_metrics(str(path))] == [1, 2]


def test_wall_time_is_the_last_summarys(tmp_path):
    log = tmp_path / "run.log"
    log.write_text('{"event": "summary", "wall_s": 3}\nnoise\n{"event": "summary", "wall_s": 4.5}\n'
                   '{"event": "start"}\n')
    assert report_data.read_wall_time(str(log)) == 4.5
    log.write_text('{"event": "summary", "wall_s": "7"}\n')
    assert report_data.read_wall_time(str(log)) is None


def test_dead_letter_rows_stay_inside_the_dataset_and_under_the_limit(tmp_path):
    (tmp_path / "dl.jsonl").write_text('{"line": 1}\nbad\n{"line": 2}\n{"line": 3}\n')
    (tmp_path.parent / "outside.jsonl").write_text('{"line": 99}\n')
    manifest = {"dead_letters": ["/etc/passwd", "../outside.jsonl", "dl.jsonl"]}
    assert report_data.read_dead_letter_rows(str(tmp_path), manifest, limit=2) == [{"line": 1}, {"line": 2}]
