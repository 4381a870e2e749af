"""The hostile review's forged `commit_seq` (docs/wip/hostile-review-issue28.md F5) against real shard runs: `gc`
and the next `shard` both refuse it in one line and change nothing (the rules themselves:
tests/unit/ops/test_generation_seq_forgery.py)."""
from __future__ import annotations

import pytest

from pipeline.ops import generations
from pipeline.shard import shard_pipeline
from tests.generation_history_fixtures import copy_of, generation_history, shard_config, tree
from tests.ops_fixtures import FAST_LOCAL, run_cli
from tests.unit.ops.test_generation_seq_forgery import _set_seq


# ------------------------------------------------------------------------------------ real shard runs
@pytest.fixture(scope="module")
def history(tmp_path_factory, tiny_tokenizer):
    return generation_history(tmp_path_factory.mktemp("seq"), tiny_tokenizer)


def test_the_hostile_review_forgery_is_refused_by_pileprep_gc_and_shard(history, tiny_tokenizer, tmp_path):
    """F5's repro: the oldest copy's commit_seq set to 10^23; gc --keep-generations 1 and the next shard run with
    --keep-generations 1 would remove the real previous generation. Both exit 2 in one line, nothing changes."""
    inbox, dataset, gens = history
    forged = copy_of(dataset, tmp_path / "F_huge")
    _set_seq(forged / "generations" / f"{gens[0]}.manifest.json", "99999999999999999999999")
    before = tree(forged)
    result = run_cli(["gc", str(forged), "--keep-generations", "1", "--yes"], timeout_s=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pileprep: error: ") and f"{gens[0]}.manifest.json" in lines[0]
    with pytest.raises(generations.HistoryError, match=f"{gens[0]}.manifest.json commit_seq"):
        shard_pipeline.run(shard_config(inbox, forged, tiny_tokenizer, 1), FAST_LOCAL, progress_every_s=0)
    assert tree(forged) == before
