"""pipeline/cli_parser.py on its own: parsing without running a command: unknown commands and abbreviations are
usage errors with a did-you-mean, counts refuse negatives, -v/-q go before or after the command, and help shows
defaults (whole commands' exit 2: tests/e2e/test_cli.py; the recipe's commands: test_pile_recipe.py)."""
from __future__ import annotations

import argparse

import pytest

from pipeline import cli_parser
from pipeline.errors import UsageError


def test_count_takes_zero_or_more():
    assert cli_parser.count("0") == 0 and cli_parser.count("12") == 12
    with pytest.raises(argparse.ArgumentTypeError, match="must be 0 or more, got -1"):
        cli_parser.count("-1")


def test_an_unknown_command_is_a_usage_error_with_a_did_you_mean():
    with pytest.raises(UsageError, match="unknown command 'shrad'.*shard.*choose from"):
        cli_parser.parse(["shrad"])


def test_an_abbreviated_option_is_refused_not_guessed():
    with pytest.raises(UsageError):
        cli_parser.parse(["inspect", "ds", "--exam", "2"])
    args, _ = cli_parser.parse(["inspect", "ds", "--examples", "2"])
    assert args.command == "inspect" and args.examples == 2


def test_verbosity_goes_before_or_after_the_command():
    assert cli_parser.parse(["-vv", "inspect", "ds"])[0].verbose == 2
    assert cli_parser.parse(["inspect", "ds", "-v"])[0].verbose == 1
    assert cli_parser.parse(["inspect", "ds"])[0].verbose == 0


def test_help_shows_a_default_but_not_a_flags_false():
    parser = cli_parser.Parser(prog="p")
    parser.add_argument("--n", type=int, default=3, help="how many")
    parser.add_argument("--on", action="store_true", help="switch")
    text = parser.format_help()
    assert "how many (default: 3)" in text and "switch (default" not in text
