"""pipeline/enabling_flags.py: options that do nothing in the run they are given to (review29 found these the
enabling-flag check missed; each ran and ignored the option). The refusal is exit 2 in one line like
tests/unit/shard/test_config_enabling_flags.py's."""
from __future__ import annotations

import dataclasses

import pytest

from pipeline.cli import main as cli_main
from pipeline.config import ShardConfig
from pipeline.enabling_flags import orphan_option_problems
from pipeline.errors import ConfigError
from tests.ops_fixtures import tokenizer_path

BASE = dict(inputs=("x.jsonl",), output="out", tokenizer="t.model")


def _shard(tmp_path, *extra) -> list:
    (tmp_path / "in.jsonl").write_text('{"text": "hello world"}\n')
    return ["shard", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out"),
            "--tokenizer", tokenizer_path(), *extra]


def _exit_2_in_one_line(code, capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("pileprep: error: "), (code, err)
    return err[0]


def test_allow_unknown_sources_without_source_weights_is_refused():
    """Nothing to allow without --source-weights: the run went on and ignored it."""
    with pytest.raises(ConfigError, match="--allow-unknown-sources.*needs --source-weights"):
        ShardConfig(**BASE, allow_unknown_sources=True).validate()


def test_dry_run_workers_without_dry_run_is_refused(tmp_path, capsys):
    """`shard --dry-run-workers 4` without --dry-run ran the real job and ignored the option (here the unit
    guard stops that job: exit 1)."""
    line = _exit_2_in_one_line(cli_main(_shard(tmp_path, "--dry-run-workers", "4")), capsys)
    assert "--dry-run-workers" in line and "--dry-run" in line, line
    assert not (tmp_path / "out").exists()


def test_num_shards_and_target_shard_mb_together_are_refused_in_a_toml_file(tmp_path, capsys):
    """On the command line argparse refuses the pair (exit 2, one line); in a --config file both were taken and
    --target-shard-mb silently ignored."""
    (tmp_path / "c.toml").write_text("num_shards = 2\ntarget_shard_mb = 5.0\n")
    line = _exit_2_in_one_line(cli_main(_shard(tmp_path, "--config", str(tmp_path / "c.toml"))), capsys)
    assert "--num-shards" in line and "--target-shard-mb" in line, line


@pytest.mark.parametrize("flags", [["--run-log", "RUN_LOG"], ["--progress-every", "5"]], ids=["run-log", "progress"])
def test_a_real_run_option_with_dry_run_is_refused(tmp_path, capsys, flags):
    """`shard --dry-run --run-log FILE` printed its estimate and wrote no run log, silently; --progress-every
    has no progress to report in a dry run either."""
    flags = [str(tmp_path / "run.jsonl") if f == "RUN_LOG" else f for f in flags]
    line = _exit_2_in_one_line(cli_main(_shard(tmp_path, "--dry-run", *flags)), capsys)
    assert flags[0] in line and "--dry-run" in line, line


def test_a_disabling_option_is_checked_only_when_given_and_typed_or_changed():
    """The dry-run pair at the function: the default of --run-log (None) with --dry-run is fine from a config,
    refused once typed; without --dry-run both are fine; values that lack the deciding field are not checked."""
    from pipeline.config import RunOptions
    fields = dataclasses.fields(RunOptions)
    values = {f.name: f.default for f in fields}
    assert orphan_option_problems({**values, "dry_run": True}, fields) == []
    (line,) = orphan_option_problems({**values, "dry_run": True}, fields, frozenset({"run_log"}))
    assert line.startswith("--run-log") and "--dry-run" in line
    assert orphan_option_problems({**values, "run_log": "x.jsonl"}, fields) == []
    assert orphan_option_problems({"run_log": "x.jsonl"}, fields) == []
