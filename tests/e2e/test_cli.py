"""The command line: options derived from the config dataclasses, --config TOML,
unknown options and abbreviations rejected with a did-you-mean, Beam's own options passed through (the README's
flag sets), one user-error family → exit 2 in one line, -v/-q after the subcommand, --version, env."""
from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from typing import Literal, Optional

import pytest

from model_contract import ContractError
from pipeline import cli, cli_parser, errors, options
from pipeline.config import RunOptions, ShardConfig, option
from tests.conftest import REPO
from tests.ops_fixtures import subprocess_env

pytestmark = pytest.mark.timeout(120)
REQUIRED = ["--input", "in/*.zst", "--output", "out", "--tokenizer", "t.model"]


def run_main(argv, capsys):
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


# ---------------------------------------------------------------------------------- derived from the config
def test_every_config_field_is_an_option_with_its_type_default_and_help():
    parser = cli_parser.build_parser()
    shard = parser._subparsers._group_actions[0].choices["shard"]  # noqa: SLF001
    by_dest = {a.dest: a for a in shard._actions}  # noqa: SLF001
    for cls in (ShardConfig, RunOptions):
        for f in dataclasses.fields(cls):
            if not f.metadata.get("cli", True):
                continue
            assert f.name in by_dest, f"{f.name} has no command-line option"
            assert f.metadata["help"], f"{f.name} has no help text"
            action = by_dest[f.name]
            if f.default is not dataclasses.MISSING:
                default = list(f.default) if isinstance(f.default, tuple) else f.default
                assert action.default == default
    args, _ = cli_parser.parse(["shard", *REQUIRED])
    built = options.build(ShardConfig, args)
    assert built == ShardConfig(inputs=("in/*.zst",), output="out", tokenizer="t.model")
    help_text = " ".join(shard.format_help().split())
    assert "(default: 2048)" in help_text and "(default: meta.pile_set_name)" in help_text
    assert "(default: 0)" in help_text  # --seed: a zero default is still shown


def test_types_map_to_argparse_including_literal_choices_and_switches():
    @dataclass(frozen=True)
    class Toy:
        mode: Literal["fast", "exact"] = option("fast", "how")
        n: Optional[int] = option(None, "count")
        names: tuple[str, ...] = option(("a",), "names", flag="--name")
        on: bool = option(False, "switch")

    p = cli_parser.Parser(prog="toy")
    options.add_options(p, Toy)
    ns = p.parse_args(["--mode", "exact", "--n", "3", "--name", "x", "y", "--on"])
    assert options.build(Toy, ns) == Toy("exact", 3, ("x", "y"), True)
    with pytest.raises(errors.UsageError, match="invalid choice"):
        p.parse_args(["--mode", "slow"])
    spec = {s.name: s for s in options.specs(Toy)}
    assert spec["mode"].choices == ("fast", "exact") and spec["names"].flag == "--name"
    with pytest.raises(errors.ConfigError, match="--mode"):
        spec["mode"].convert("slow")


# -------------------------------------------------------------------------------------------- --config
def test_config_file_supplies_options_and_flags_override_it(tmp_path):
    cfg = tmp_path / "shard.toml"
    cfg.write_text('input = ["a/*.zst", "b/*.zst"]\noutput = "ds"\ntokenizer = "t.model"\nseq-len = 512\n'
                   'val_fraction = 0.05\nsource-field = "source"\nincremental = true\n'
                   'beam-args = ["--runner=FnApiRunner", "--direct_num_workers=1"]\n')
    args, beam_args = cli_parser.parse(["shard", "--config", str(cfg), "--seq-len", "1024"])
    config, run = options.build(ShardConfig, args), options.build(RunOptions, args)
    assert config.inputs == ("a/*.zst", "b/*.zst") and config.output == "ds"
    assert config.seq_len == 1024  # the flag wins
    assert config.val_fraction == 0.05 and config.source_fields == ("source",) and run.incremental
    assert beam_args == ["--runner=FnApiRunner", "--direct_num_workers=1"]


@pytest.mark.parametrize("body, needle", [
    ("seqlen = 512\n", "unknown key 'seqlen' (did you mean seq-len?)"),
    ('seq-len = "long"\n', "--seq-len: expected an integer"),
    ("seq-len = 5.5\n", "--seq-len: expected an integer"),
    ("incremental = 3\n", "--incremental: expected true or false"),
    ("input = [1, 2]\n", "--input: expected a string or a list of strings"),
    ("seq-len = \n", "--config"),
    ('tokenizer-backend = "fast"\n', "--tokenizer-backend: 'fast' is not one of auto, reference, sentencepiece, gigatoken, kitoken, splintr"),
])
def test_bad_config_file_is_one_line_exit_2(tmp_path, capsys, body, needle):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    rc, out, err = run_main(["shard", "--config", str(cfg), *REQUIRED], capsys)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


# --------------------------------------------------------------- unknown options (README.md: "did you mean --seq-len?")
@pytest.mark.parametrize("argv, needle", [
    (["shard", *REQUIRED, "--seqlen", "512"], "unrecognized option --seqlen (did you mean --seq-len?)"),
    (["shard", *REQUIRED, "--num-shard", "4"], "unrecognized option --num-shard (did you mean --num-shards?)"),
    (["shard", *REQUIRED, "--seq", "4"], "unrecognized option --seq (did you mean --seq-len?)"),
    (["shard", *REQUIRED, "--runer=FlinkRunner"], "did you mean --runner?"),
    (["shard", *REQUIRED, "--dry_run"], "unrecognized option --dry_run (did you mean --dry-run?)"),  # not Beam's
    (["shard", *REQUIRED, "--seq_len=512"], "unrecognized option --seq_len (did you mean --seq-len?)"),
    (["shard", *REQUIRED, "--runner=NoSuchRunner"], "no such Beam runner"),
    (["shard", *REQUIRED, "--flink_version=0.1", "--runner=FlinkRunner"], "--flink_version"),
    (["shard", *REQUIRED, "--dask_client_address=h:1"], "unrecognized option --dask_client_address"),
    (["inspect", "ds", "--exampls", "3"], "unrecognized argument --exampls (did you mean --examples?)"),
    (["shrad", *REQUIRED], "unknown command 'shrad' (did you mean shard?)"),
    (["shard", "--output", "o"], "the following arguments are required: --input, --tokenizer"),
    (["shard", *REQUIRED, "--seq-len", "x"], "invalid int value"),
])
def test_unknown_and_abbreviated_options_exit_2_with_a_suggestion(capsys, argv, needle):
    rc, out, err = run_main(argv, capsys)
    assert rc == 2, err
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not out


def test_seqlen_typo_never_runs_with_the_default(capsys, monkeypatch):
    """Before: `--seqlen 512` went to Beam, was dropped with a warning, and the job ran at 2048."""
    called = []
    monkeypatch.setattr(cli, "cmd_shard", lambda *a: called.append(a) or 0)
    assert cli.main(["shard", *REQUIRED, "--seq-len", "512"]) == 0 and called  # the stand-in is wired
    called.clear()
    assert cli.main(["shard", *REQUIRED, "--seqlen", "512"]) == 2 and not called


def test_runner_specific_options_exist_once_the_runner_is_named():
    dask = importlib_spec("dask.distributed")
    if dask is None:
        pytest.skip("dask is not installed")
    _, beam_args = cli_parser.parse(["shard", *REQUIRED, "--runner=apache_beam.runners.dask.dask_runner.DaskRunner",
                              "--dask_client_address=127.0.0.1:8786"])
    assert "--dask_client_address=127.0.0.1:8786" in beam_args


def importlib_spec(name):
    import importlib.util

    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None


def readme_flag_sets() -> dict:
    """The README's `pileprep shard ...` commands of 'Running on Dataflow, Flink or Spark', by heading comment."""
    text = (REPO / "README.md").read_text()
    block = text.split("### Running on Dataflow, Flink or Spark", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    sets, title, current = {}, None, []
    for line in block.splitlines():
        if line.startswith("#"):
            title = line.lstrip("# ").split()[0] + " " + line.lstrip("# ").split()[1]
            continue
        if not line.strip():
            continue
        current.append(line.split("  #")[0].rstrip().rstrip("\\"))
        if not line.rstrip().endswith("\\"):
            sets[title] = shlex.split(" ".join(current))
            current = []
    return sets


def test_readme_dataflow_flink_and_spark_flag_sets_parse():
    sets = readme_flag_sets()
    assert {"Google Cloud", "Apache Flink", "Apache Spark"} <= set(sets), sets.keys()
    for title, words in sets.items():
        assert words[:2] == ["pileprep", "shard"]
        argv = words[1:]
        if "..." in argv:
            argv = [a for a in argv if a != "..."] + REQUIRED
        if "--runner=DataflowRunner" in argv and importlib_spec("apitools") is None:
            with pytest.raises(errors.UsageError, match=r"pileprep\[gcp\]"):
                cli_parser.parse(argv)
            continue
        args, beam_args = cli_parser.parse(argv)
        assert beam_args and all(not a.startswith("--" + o) for a in beam_args
                                 for o in ("input", "output", "tokenizer", "seq-len")), title
        assert options.runner_name(beam_args), title
    dataflow = sets["Google Cloud"]
    assert any(a.startswith("--sdk_container_image=") for a in dataflow)
    for title in ("Apache Flink", "Apache Spark"):
        assert any(a.startswith("--environment_config=") and "pileprep-worker" in a for a in sets[title])


# ----------------------------------------------------------------------------------------- user errors
def test_user_errors_are_classes_not_names():
    assert errors.is_user_error(errors.ConfigError("x")) and errors.is_user_error(ContractError("x"))
    from transforms.tokenize.tokenizer import TokenizerError

    assert errors.is_user_error(TokenizerError("x"))
    ContractErrorLookalike = type("ContractError", (ValueError,), {})  # same name, different class
    assert not errors.is_user_error(ContractErrorLookalike("x"))
    assert not errors.is_user_error(ValueError("x"))
    assert errors.one_line(errors.ConfigError("invalid:\n  a\n  b")) == "invalid: a; b"


def _cli(*argv, timeout=120, env=None):
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *argv], capture_output=True, text=True,
                          env=subprocess_env(PYTHONPATH=str(REPO), **(env or {})), cwd=str(REPO), timeout=timeout)


def test_every_command_reports_user_errors_in_one_line_exit_2(tmp_path):
    cases = [
        (["tokenizer", "train", "--input", "/nonexistent/*.zst", "--output", str(tmp_path / "t.model")],
         "matched no files"),
        (["inspect", str(tmp_path / "missing")], "no manifest"),
        (["shard", "--input", str(tmp_path / "none" / "*"), "--output", str(tmp_path / "o"), "--tokenizer",
          str(tmp_path / "t.model")], "--input"),
    ]
    tmp = tmp_path / "tmpdir"  # the worker log starts in $TMPDIR
    tmp.mkdir()
    for argv, needle in cases:
        res = _cli(*argv, env={"TMPDIR": str(tmp)})
        assert res.returncode == 2, (argv, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("pileprep: error:"), res.stderr
    assert not (tmp_path / "o").exists()
    assert not list(tmp.iterdir())  # a user error leaves no worker log behind


def test_verbosity_after_the_subcommand_version_and_env(capsys):
    args, _ = cli_parser.parse(["shard", *REQUIRED, "-v", "-v"])
    assert args.verbose == 2 and args.quiet is False
    args, _ = cli_parser.parse(["-v", "inspect", "ds", "-q"])
    assert args.verbose == 1 and args.quiet is True
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and re.fullmatch(r"pileprep \d+\.\d+\.\d+\n", capsys.readouterr().out)
    rc, out, _ = run_main(["env", "--json"], capsys)
    import json

    report = json.loads(out)
    assert rc == 0 and report["packages"]["apache-beam"] and "active" in report["c_varint_codec"]
    from model_contract import example_codec

    assert report["c_varint_codec"]["active"] == (example_codec._fast is not None)  # noqa: SLF001
    from transforms.shard.near_dedup import hashing

    assert report["c_shingles"]["active"] == (hashing.fast is not None)


def test_a_bad_choice_built_in_code_fails_validation_with_the_types_own_choices():
    """ShardConfig made in code (the Airflow DAG, tests) skips the CLI's choice check: validate() refuses any
    value outside a Literal field's choices, naming the flag and listing them."""
    from pipeline.config import ShardConfig
    from pipeline.errors import ConfigError

    good = ShardConfig(inputs=("a",), output="o", tokenizer="t")
    for name, flag, listed in (("tokenizer_backend", "--tokenizer-backend",
                                "auto, reference, sentencepiece, gigatoken, kitoken or splintr"),
                               ("shuffle", "--shuffle", "auto, files or runner")):
        with pytest.raises(ConfigError, match=f"{flag} must be {listed}, got 'bogus'"):
            dataclasses.replace(good, **{name: "bogus"}).validate()
    good.validate()


_WITH_AN_ATEXIT_HOOK = ("import atexit, sys; atexit.register(lambda: sys.stderr.write('interpreter teardown\\n')); "
                        "from pipeline.cli import main; sys.exit(main())")


def test_a_command_ends_with_the_interpreter_s_ordinary_teardown():
    """pipeline/cli.py: a command that succeeds or fails ends the ordinary way (atexit hooks run), with what it
    printed all there; only an interrupted job that asks for it skips teardown (_exit_without_teardown)."""
    import json

    ok = subprocess.run([sys.executable, "-c", _WITH_AN_ATEXIT_HOOK, "env", "--json"], capture_output=True,
                        text=True, env=subprocess_env(PYTHONPATH=str(REPO)), cwd=str(REPO), timeout=120)
    assert ok.returncode == 0 and json.loads(ok.stdout)["packages"]["apache-beam"]
    assert ok.stderr.endswith("interpreter teardown\n")
    failed = subprocess.run([sys.executable, "-c", _WITH_AN_ATEXIT_HOOK, "inspect", "/nonexistent/dataset"],
                            capture_output=True, text=True, env=subprocess_env(PYTHONPATH=str(REPO)), cwd=str(REPO),
                            timeout=120)
    assert failed.returncode == 2 and failed.stderr.endswith("interpreter teardown\n")
