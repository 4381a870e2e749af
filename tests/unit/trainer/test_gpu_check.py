"""bench/gpu_check.py runs end to end on CPU with tiny shapes, writes its JSON per section, skips on rerun."""
from __future__ import annotations

import importlib.util
import json

import pytest

from tests.trainer_launch import REPO


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(300)
def test_gpu_check_tiny_on_cpu_then_rerun_skips(tmp_path, capsys):
    gc = _load()
    rc = gc.main(["--tiny", "--device", "cpu", "--out", str(tmp_path), "--limit-scale", "3"])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert list(report) == list(gc.SECTIONS)  # the order, one entry per section
    assert rc == 0, {k: v.get("error") for k, v in report.items()}
    step = report["step"]["result"]
    assert step["first_step_losses_agree"] is True
    assert set(step["variants"]) == {"before", "after"}
    assert step["variants"]["before"]["attention"] == "sdpa" and step["variants"]["after"]["loss"] == "chunked"
    mixes = report["attention"]["result"]["mixes"]
    assert len(mixes) == 2 and all(row["flex"]["status"] == "ok" for row in mixes.values())
    assert report["loader"]["result"]["tokens_per_s"] > 0
    assert report["cli"]["result"]["resumed"] is True

    capsys.readouterr()
    assert gc.main(["--tiny", "--device", "cpu", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("done in an earlier run: skipped") == len(gc.SECTIONS)


def test_a_section_over_its_limit_is_recorded_and_the_next_still_runs(tmp_path):
    gc = _load()
    gc.LIMITS["versions"] = 0.001  # the versions section cannot finish in a millisecond
    try:
        rc = gc.main(["--tiny", "--device", "cpu", "--out", str(tmp_path), "--sections", "versions", "loader"])
    finally:
        gc.LIMITS["versions"] = 15
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rc == 1
    assert report["versions"]["status"] == "timeout" and report["loader"]["status"] == "ok"
