"""bench/gpu_check.py's sections, limits and kernels on CPU with tiny shapes (its whole run, JSON per section and skip
on rerun: tests/integration/trainer/test_gpu_check.py)."""
from __future__ import annotations

import importlib.util
import json

from tests.trainer_launch import REPO


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def test_a_failing_variant_keeps_the_variants_before_it(tmp_path, monkeypatch):
    """Results are saved as soon as they exist: "after" failing (a timeout takes the same path) keeps "before"."""
    gc = _load()
    monkeypatch.setitem(gc.VARIANTS, "after", ("no-such-kernel", False, "chunked", "auto"))
    rc = gc.main(["--tiny", "--device", "cpu", "--out", str(tmp_path), "--sections", "step",
                  "--variants", "before", "after"])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rc == 1 and report["step"]["status"] == "error" and "no-such-kernel" in report["step"]["error"]
    assert report["step"]["result"]["variants"]["before"]["status"] == "ok"


def test_torch_2_11_varlen_call_form_is_used_where_window_size_is_missing(monkeypatch):
    import torch.nn.attention.varlen as varlen
    from trainer import attention

    def varlen_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
        raise AssertionError("not called")

    monkeypatch.setattr(varlen, "varlen_attn", varlen_2_11)
    attention._varlen_causal_kwargs.cache_clear()
    try:
        assert dict(attention._varlen_causal_kwargs()) == {"is_causal": True}
    finally:
        attention._varlen_causal_kwargs.cache_clear()
