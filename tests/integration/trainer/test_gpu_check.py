"""bench/gpu_check.py runs end to end on CPU with tiny shapes, writes its JSON per section, skips on rerun (~8 s of
CPU: over tests/unit/conftest.py UNIT_TEST_CPU_S, so here; its other tests stay in tests/unit/trainer/)."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

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
    assert set(step["variants"]) == {"before", "after-no-compile", "after"}
    assert step["variants"]["before"]["attention"] == "sdpa" and step["variants"]["after"]["loss"] == "chunked"
    # what ran is what the trainer would choose on this device, and what is reported
    from trainer.attention import resolve_impl
    from trainer.optim import adamw_impl
    cpu = torch.device("cpu")
    for name, row in step["variants"].items():
        attention, compiled, _, adamw = gc.VARIANTS[name]
        assert row["status"] == "ok" and row["tokens_per_s"] > 0, row
        assert row["attention"] == resolve_impl(attention, cpu) and row["adamw"] == adamw_impl(adamw, cpu)
        assert row["fused_adamw"] == (row["adamw"] == "fused") and row["compile_per_block"] == compiled
    assert step["variants"]["after"]["compile_backend"] == "aot_eager"
    assert report["versions"]["result"]["torch"] == torch.__version__
    mixes = report["attention"]["result"]["mixes"]
    assert len(mixes) == 2 and all(row["flex"]["status"] == "ok" for row in mixes.values())
    assert report["loader"]["result"]["tokens_per_s"] > 0
    assert report["cli"]["result"]["resumed"] is True

    last_line = report["cli"]["result"]["first_run_last_line"]
    assert "resume with:" in last_line
    # the resume command is the run less what only the first run wanted (trainer/progress.py _DROP_FLAGS), read
    # as arguments: a checkout's path may well contain "fresh" (a clean clone at $d/fresh did)
    resume_args = last_line.split("resume with:", 1)[1].split()
    assert "--stop-at-step" not in resume_args and "--no-resume" not in resume_args
    capsys.readouterr()
    assert gc.main(["--tiny", "--device", "cpu", "--out", str(tmp_path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"torch {torch.__version__} | CUDA ")  # versions before anything else
    capsys.readouterr()
    assert gc.main(["--tiny", "--device", "cpu", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("done in an earlier run: skipped") == len(gc.SECTIONS)
