"""pipeline/tools/dry_run_calibration.py's pure parts: what the calibration adds to the estimate, and the slices
written compressed as their files were (the job run on real slices: tests/integration/tools/test_dry_run.py)."""
from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import zstandard

from pipeline.tools.dry_run_calibration import Calibration, calibrate, write_slices


def test_the_extra_cpu_is_the_jobs_rate_above_the_models_and_never_negative():
    cal = Calibration(raw_bytes=100, job_cpu_per_byte=3e-6, model_cpu_per_byte=1e-6, overhead_cpu_s=0.5)
    assert cal.extra_cpu_per_byte == pytest.approx(2e-6) and cal.factor == pytest.approx(3.0)
    noise = Calibration(raw_bytes=100, job_cpu_per_byte=1e-6, model_cpu_per_byte=2e-6, overhead_cpu_s=0.5)
    assert noise.extra_cpu_per_byte == 0.0
    assert Calibration(100, 1e-6, 0.0, 0.5).factor == 1.0  # no model rate: no ratio to show


def test_slices_are_written_compressed_as_their_files_were(tmp_path):
    lines = [b'{"text": "a"}', b'{"text": "b"}']
    paths = write_slices([("in/a.jsonl.zst", lines), ("in/b.jsonl.gz", lines), ("in/c.jsonl", lines)],
                         str(tmp_path))
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["slice-000.jsonl.zst", "slice-001.jsonl.gz", "slice-002.jsonl"]
    body = b'{"text": "a"}\n{"text": "b"}\n'
    data = [Path(p).read_bytes() for p in paths]
    assert zstandard.ZstdDecompressor().decompressobj().decompress(data[0]) == body
    assert gzip.decompress(data[1]) == body and data[2] == body


def test_no_slices_no_calibration():
    assert calibrate(None, [], lambda *a: 0.0) is None
