"""`pileprep export DATASET` on a path that holds no dataset: exit 2, one line, and nothing created.

Found by the s37 review: the export (parquet, megatron, hf, mds alike) answers `no manifest at .../manifest.json`
with exit 2 but leaves DATASET behind as an empty directory (the same at 86b6001). A typo in a path thus creates
a directory; `pileprep export /nonexistent` made /nonexistent, after which
tests/unit/trainer/test_plan.py::test_the_trainer_refuses_a_layout_over_the_gpu_and_takes_6_7b_as_tp_x_pp_x_dp
(which takes `--data /nonexistent` to mean "no dataset here") fails with FileNotFoundError in `make test-fast`.
"""
from __future__ import annotations

import pytest

from pipeline.cli import main as cli_main


@pytest.mark.parametrize("fmt", ["parquet", "megatron", "hf", "mds"])
def test_export_of_a_missing_dataset_is_exit_2_and_creates_nothing(tmp_path, capsys, fmt):
    missing = tmp_path / "no-such-dataset"
    rc = cli_main(["export", str(missing), "--format", fmt])
    err = capsys.readouterr().err.strip().splitlines()
    assert (rc, len(err)) == (2, 1) and err[0].startswith("pileprep: error: no manifest"), (rc, err)
    assert not missing.exists(), f"export of a missing dataset created {missing}"
