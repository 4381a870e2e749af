"""The Pile recipe (docs/PILE.md): reachable from the README's first screen, its `pileprep shard` commands parse
as the CLI parses them, and the shuffle each runner gets is the one the recipe and `--help` say
(pipeline/ops/runners.py choose_shuffle decides)."""
from __future__ import annotations

import re
import shlex

from pipeline import cli_parser, options
from pipeline.config import ShardConfig
from pipeline.ops import runners
from tests.conftest import REPO

README_FIRST_SCREEN_LINES = 40


def _recipe_commands() -> list:
    """(the runner named or None, argv after `pileprep`) of every `pileprep shard $COMMON ...` in docs/PILE.md,
    with $COMMON, $IN and $OUT expanded as the recipe sets them."""
    text = (REPO / "docs" / "PILE.md").read_text()
    script = "\n".join(re.findall(r"```sh\n(.*?)```", text, re.S))
    lines = re.sub(r"\\\n\s*", " ", script).splitlines()  # continuation lines joined
    env = {}
    for line in lines:
        m = re.match(r"^(IN|OUT|COMMON)=(.*)$", line.strip())
        if m:
            value = shlex.split(m.group(2), comments=True)[0]
            for name, v in env.items():
                value = value.replace(f"${name}", v)
            env[m.group(1)] = value
    assert set(env) == {"IN", "OUT", "COMMON"}, env
    commands = []
    for line in lines:
        if line.strip().startswith("pileprep shard $COMMON"):
            words = shlex.split(line.replace("$COMMON", env["COMMON"]), comments=True)
            commands.append(words[1:])
    return commands


def test_the_readme_links_the_pile_recipe_on_its_first_screen():
    first_screen = (REPO / "README.md").read_text().splitlines()[:README_FIRST_SCREEN_LINES]
    assert any("(docs/PILE.md)" in line for line in first_screen)


def test_every_recipe_command_parses_and_gets_the_shuffle_the_recipe_says():
    commands = _recipe_commands()
    runners_named = [options.runner_name([a for a in argv if a.startswith("--runner")]) for argv in commands]
    assert {"FnApiRunner", "DaskRunner", "DataflowRunner"} <= set(runners_named), runners_named
    assert any("--dry-run" in argv for argv in commands)
    for argv, runner in zip(commands, runners_named):
        assert "--source-weights" in argv and "--val-input" in argv and "--test-input" in argv, argv
        expected = "files" if runner in (None, "FnApiRunner") else "runner"  # docs/PILE.md §1
        assert runners.choose_shuffle("auto", runner or "") == expected, runner
        if runner == "DataflowRunner":
            continue  # parsing Dataflow's options needs the gcp extra (tests/e2e/test_cli.py)
        args, beam_args = cli_parser.parse(argv)
        assert args.source_weights == "pile" and args.seq_len == 2048
        assert runners.choose_shuffle(args.shuffle, options.runner_name(beam_args) or "") == expected, argv


def test_shuffle_help_names_the_shuffle_each_runner_gets():
    """`--help` lists the runners `auto` gives the runner's GroupByKey and those it gives the file spill; the
    lists agree with what `auto` really chooses."""
    import dataclasses

    text = " ".join(next(f for f in dataclasses.fields(ShardConfig) if f.name == "shuffle").metadata["help"].split())
    m = re.search(r"auto = runner on [^(]*\(([^)]*)\), files on the local ([\w/]+)", text)
    assert m, text
    distributed = [n.strip() for n in m.group(1).split(",")]
    local = m.group(2).split("/")
    assert {"Dataflow", "Flink", "Spark", "Dask", "PortableRunner"} <= set(distributed)
    for name in distributed:
        assert runners.choose_shuffle("auto", name if name.endswith("Runner") else name + "Runner") == "runner", name
    assert {"FnApiRunner", "DirectRunner"} <= set(local)
    for name in local:
        assert runners.choose_shuffle("auto", name if name.endswith("Runner") else name + "Runner") == "files", name
    help_text = cli_parser.build_parser()._subparsers._group_actions[0].choices["shard"].format_help()  # noqa: SLF001
    assert "auto = runner on every runner whose GroupByKey is distributed" in " ".join(help_text.split())

