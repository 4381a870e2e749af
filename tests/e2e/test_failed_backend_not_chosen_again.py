"""A fast backend whose spot check failed is recorded in the staging (pipeline/shard/markers.py
mark_backend_failed) and the next `auto` run of the generation reads that record (pipeline/shard/plan.py) and
does not choose it again, so none of the units it finished are reused. Guards the issue-28 mutation check
(docs/wip/mutation-issue28.md) found untested: the routing e2e test reruns with `reference` only, whose key
differs anyway.

Both tokenize graphs (pipeline/shard/graph.py spread_chunks_needed): 2 workers on these files spread
the chunks (TokenizeChunk), 1 worker fuses cut and tokenize (CutAndTokenizeFile); both record the failure
(stage_dofn.TokenizeChunk._tokenized) and the driver's resume.keep_finished keeps the record beside the finished units. The
rerun's reconcile discards every unit the failed backend finished (another backend key) and reuses none."""
from __future__ import annotations

import json
import re

import pytest

from tests.e2e.test_backend_routing import FAULT, hf_bpe_file, setup  # noqa: F401 - fixtures
from tests.ops_fixtures import run_cli, subprocess_env

pytest.importorskip("gigatoken")


def _shard(root, tok, out, cache, workers: int, fault: str = ""):
    env = subprocess_env(PILEPREP_TOKENIZER_CACHE=str(cache), PILEPREP_TEST_BACKEND_FAULT=fault)
    return run_cli(["shard", "--input", f"{root}/*", "--output", str(out), "--tokenizer", str(tok),
                    "--seq-len", "128", "--num-shards", "2", "--tokenizer-backend", "auto", "--runner=FnApiRunner",
                    f"--direct_num_workers={workers}", "--direct_running_mode=in_memory"], timeout_s=400, env=env)


@pytest.mark.parametrize("workers", [2, 1], ids=["spread", "fused"])
def test_an_auto_rerun_after_a_failed_spot_check_uses_the_reference(setup, tmp_path, workers):  # noqa: F811
    root, tok = setup
    cache, out = tmp_path / "cache", tmp_path / "out"
    failed = _shard(root, tok, out, cache, workers, fault=FAULT)
    assert failed.returncode != 0 and "--tokenizer-backend reference" in failed.stderr, failed.stderr[-3000:]
    assert list((out / "_staging").glob("*/failed-backends/*.json")), "no failure record survived the run"
    proc = _shard(root, tok, out, cache, workers)  # the same command again, without the fault
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the failed backend's finished units were there to reuse, and each was discarded (another backend key)
    assert "made by tokenizer backend 'gigatoken=" in proc.stderr, proc.stderr[-3000:]
    reused = re.search(r"^units_reused +([0-9,]+)", proc.stdout + proc.stderr, re.M)
    assert reused is None or reused.group(1) == "0", reused.group(0)
    section = json.loads((out / "manifest.json").read_bytes())["tokenizer_backend"]
    assert section["name"] == "tokenizers", section
    assert "gigatoken: failed a spot check in an earlier run of this generation" in section["reason"]
