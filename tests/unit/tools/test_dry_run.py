"""`pileprep shard --dry-run` (issue 11 §5): estimates within ±20% of the real run, and nothing written."""
from __future__ import annotations

import pytest

from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from pipeline.tools import dry_run
from tests.ops_fixtures import FAST_LOCAL, real_corpus, run_cli, tokenizer_path

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """One real run over the shared sample files (Pile zst, arxiv and Enron jsonl): the reference."""
    root = tmp_path_factory.mktemp("dry")
    corpus = real_corpus(root / "corpus")
    cfg = ShardConfig(inputs=(str(corpus / "*"),), output=str(root / "out"), tokenizer=tokenizer_path(),
                      seq_len=256, num_shards=2, val_fraction=0.2, test_fraction=0.1)
    manifest = shard_pipeline.run(cfg, FAST_LOCAL, progress_every_s=0)
    return cfg, manifest


def _within(estimated, actual, tolerance=0.20):
    return abs(estimated - actual) <= tolerance * actual


@pytest.mark.parametrize("budget", [dry_run.SAMPLE_INPUT_BYTES_PER_FILE, 200_000])
def test_estimates_are_within_20_percent_of_the_real_run(real_run, tmp_path, budget):
    """Whole files, and a budget that reads only part of the largest file (1.2 MB of arxiv)."""
    cfg, manifest = real_run
    fresh = ShardConfig(**{**cfg.__dict__, "output": str(tmp_path / "never")})
    est = dry_run.estimate(fresh, FAST_LOCAL, budget_per_file=budget)
    shards = manifest["shards"]
    actual = {"tokens": sum(s["tokens"] for s in manifest["splits"].values()),
              "examples": sum(s["examples"] for s in shards), "shards": len(shards),
              "output_bytes": sum(s["bytes"] for s in shards)}
    estimated = {"tokens": est.tokens, "examples": est.examples, "shards": est.shards,
                 "output_bytes": est.output_bytes}
    for key in actual:
        print(f"dry run / real run, {key}, budget {budget}: {estimated[key]} / {actual[key]} = "
              f"{estimated[key] / actual[key]:.3f}")
        assert _within(estimated[key], actual[key]), (key, estimated[key], actual[key], budget)
    assert est.files == 5 and est.sampled_files == 5
    assert est.input_bytes > 0 and est.core_hours > 0
    if budget < 1_000_000:
        assert est.sampled_input_bytes < est.input_bytes  # really a partial sample
    assert not (tmp_path / "never").exists()


def test_cli_dry_run_prints_the_estimate_and_writes_nothing(tmp_path):
    corpus = real_corpus(tmp_path / "corpus", names=("pile/00.jsonl.zst", "pile/val.jsonl.zst"))
    out = tmp_path / "out"
    res = run_cli(["shard", "--input", str(corpus / "*"), "--output", str(out), "--tokenizer", tokenizer_path(),
                   "--seq-len", "256", "--dry-run"], timeout_s=120)
    assert res.returncode == 0, res.stderr[-2000:]
    for row in ("input files", "tokens", "examples", "shards", "output bytes", "core-hours"):
        assert row in res.stdout
    assert not out.exists()
    bad = run_cli(["shard", "--input", str(corpus / "*"), "--output", str(out), "--tokenizer", tokenizer_path(),
                   "--seq-len", "1", "--dry-run"], timeout_s=120)
    assert bad.returncode == 2 and "--seq-len" in bad.stderr  # same validation as a real run


def test_val_and_test_inputs_are_estimated_as_whole_splits(tmp_path):
    """--val-input / --test-input files go whole to their split (no hashing), as the real run does."""
    corpus = real_corpus(tmp_path / "corpus", names=("pile/00.jsonl.zst", "other/arxiv.jsonl",
                                                      "pile/val.jsonl.zst", "pile/test.jsonl.zst"))
    cfg = ShardConfig(inputs=(str(corpus / "00.jsonl.zst"), str(corpus / "arxiv.jsonl")), output=str(tmp_path / "o"),
                      val_inputs=(str(corpus / "val.jsonl.zst"),), test_inputs=(str(corpus / "test.jsonl.zst"),),
                      tokenizer=tokenizer_path(), seq_len=256, num_shards=2, val_fraction=0.0, test_fraction=0.0)
    est = dry_run.estimate(ShardConfig(**{**cfg.__dict__, "output": str(tmp_path / "never")}), FAST_LOCAL)
    manifest = shard_pipeline.run(cfg, FAST_LOCAL, progress_every_s=0)
    for split in ("train", "val", "test"):
        actual = manifest["splits"][split]["tokens"]
        assert actual > 0 and _within(est.tokens_per_split[split], actual), (split, est.tokens_per_split, actual)
    assert not (tmp_path / "never").exists()
