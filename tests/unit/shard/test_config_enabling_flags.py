"""pipeline/config.py ShardConfig.validate: an option that only shapes a stage the run does not have is a bad
configuration (exit 2, one line `pileprep: error: ...` naming the flag that enables it), on the command line and
in a `--config` TOML file alike - before, `--near-dedup-shingles tokens` without `--near-dedup` ran and did
nothing (issue 29, "small old behaviours").

Typed on the command line (pipeline/cli_parser.py records what was typed), such an option is refused even at its
default value: the user asked for something that does nothing. At its default in a --config file or a
ShardConfig built in code it has no effect either way and stays accepted; the serialized config and the
fingerprint of every valid run are unchanged (pinned by tests/unit/shard/test_near_dedup_settings.py and the
defaults tests below).
"""
from __future__ import annotations

import json

import pytest

from pipeline import cli_parser, options
from pipeline.cli import main as cli_main
from pipeline.config import ShardConfig, fingerprint
from pipeline.errors import ConfigError
from tests.ops_fixtures import tokenizer_path

BASE = dict(inputs=("x.jsonl",), output="out", tokenizer="t.model")
# (the orphan option as a flag, its ShardConfig field and value, the enabling flag the error must name)
ORPHANS = [
    (["--near-dedup-shingles", "tokens"], dict(near_dedup_shingles="tokens"), "--near-dedup"),
    (["--near-dedup-bands", "8"], dict(near_dedup_bands=8), "--near-dedup"),
    (["--near-dedup-rows", "3"], dict(near_dedup_rows=3), "--near-dedup"),
    (["--near-dedup-threshold", "0.5"], dict(near_dedup_threshold=0.5), "--near-dedup"),
    (["--near-dedup-verify"], dict(near_dedup_verify=True), "--near-dedup"),
    (["--near-dedup-rounds", "7"], dict(near_dedup_rounds=7), "--near-dedup"),
    (["--decontaminate-field", "question"], dict(decontaminate_field="question"), "--decontaminate"),
    (["--decontaminate-ngram", "8"], dict(decontaminate_ngram=8), "--decontaminate"),
    (["--decontaminate-held-out"], dict(decontaminate_held_out=True), "--decontaminate"),
    (["--packing-window", "3"], dict(packing_window=3), "--packing best-fit"),
]


def _shard(tmp_path, *extra) -> list:
    (tmp_path / "in.jsonl").write_text('{"text": "hello world"}\n')
    return ["shard", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out"),
            "--tokenizer", tokenizer_path(), "--runner=FnApiRunner", *extra]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pileprep: error: "), err
    return err[0]


@pytest.mark.parametrize(("flags", "fields", "enabler"), ORPHANS, ids=[o[0][0] for o in ORPHANS])
def test_an_option_without_its_enabling_flag_is_refused(flags, fields, enabler):
    with pytest.raises(ConfigError, match=f"{flags[0]} .*needs {enabler}"):
        ShardConfig(**BASE, **fields).validate()


@pytest.mark.parametrize(("flags", "fields", "enabler"), ORPHANS[:1] + ORPHANS[6:7] + ORPHANS[-1:],
                         ids=["shingles", "field", "window"])
def test_on_the_command_line_it_is_exit_2_in_one_line(tmp_path, capsys, flags, fields, enabler):
    assert cli_main(_shard(tmp_path, *flags)) == 2
    line = _one_error_line(capsys)
    assert flags[0] in line and f"needs {enabler}" in line, line
    assert not (tmp_path / "out").exists()


def test_in_a_toml_file_it_is_exit_2_in_one_line(tmp_path, capsys):
    (tmp_path / "c.toml").write_text('near-dedup-shingles = "tokens"\ndecontaminate_field = "q"\n')
    assert cli_main(_shard(tmp_path, "--config", str(tmp_path / "c.toml"))) == 2
    line = _one_error_line(capsys)
    assert "--near-dedup-shingles" in line and "--decontaminate-field" in line, line


@pytest.mark.parametrize(("enabled", "fields"), [
    (dict(near_dedup=True), dict(near_dedup_shingles="tokens", near_dedup_bands=8, near_dedup_verify=True)),
    (dict(decontaminate=("e.jsonl",)), dict(decontaminate_field="q", decontaminate_ngram=8,
                                             decontaminate_held_out=True)),
    (dict(packing="best-fit"), dict(packing_window=3)),
])
def test_with_its_enabling_flag_it_is_accepted(enabled, fields):
    ShardConfig(**BASE, **enabled, **fields).validate()


def test_options_at_their_defaults_are_accepted_and_change_no_byte():
    """Writing a default explicitly (a TOML file listing every key) is harmless: same config, same name."""
    defaults = {f: getattr(ShardConfig, f) for fields in (o[1] for o in ORPHANS) for f in fields}
    explicit = ShardConfig(**BASE, **defaults)
    explicit.validate()
    assert explicit.to_manifest_dict() == ShardConfig(**BASE).to_manifest_dict()
    assert fingerprint(explicit, "t", []) == fingerprint(ShardConfig(**BASE), "t", [])


# Typed on the command line, an option is refused without its enabling flag even at its default value: the user
# asked for something that does nothing (issue 29's review). The flag is spelled as typed, with its value.
TYPED_AT_DEFAULT = [(flags[0], fields, enabler) for flags, fields, enabler in ORPHANS
                    if not isinstance(next(iter(fields.values())), bool)]  # a switch typed is never its default


@pytest.mark.parametrize(("flag", "fields", "enabler"), TYPED_AT_DEFAULT, ids=[t[0] for t in TYPED_AT_DEFAULT])
@pytest.mark.parametrize("spelling", ["separate", "equals"])
def test_typed_on_the_command_line_at_its_default_it_is_refused_too(tmp_path, capsys, flag, fields, enabler,
                                                                     spelling):
    default = getattr(ShardConfig, next(iter(fields)))
    typed = [flag, str(default)] if spelling == "separate" else [f"{flag}={default}"]
    assert cli_main(_shard(tmp_path, *typed)) == 2
    line = _one_error_line(capsys)
    assert f"{flag} {default} needs {enabler}" in line, line
    assert not (tmp_path / "out").exists()


def _built(argv: list) -> ShardConfig:
    args, _ = cli_parser.parse(argv)
    config = options.build(ShardConfig, args)
    config.validate()
    return config


def test_a_toml_file_spelling_out_the_defaults_stays_accepted_and_changes_no_byte(tmp_path):
    """A --config file listing every key at its default asked for nothing: accepted, and the run's config and
    fingerprint are those of the same command without the file."""
    defaults = {f: getattr(ShardConfig, f) for fields in (o[1] for o in ORPHANS) for f in fields}
    (tmp_path / "c.toml").write_text("".join(f"{k.replace('_', '-')} = {json.dumps(v)}\n"
                                             for k, v in defaults.items()))
    with_file = _built(_shard(tmp_path, "--config", str(tmp_path / "c.toml")))
    without = _built(_shard(tmp_path))
    assert with_file == without
    assert fingerprint(with_file, "t", []) == fingerprint(without, "t", [])


@pytest.mark.parametrize(("enabling", "typed"), [
    (["--near-dedup"], ["--near-dedup-shingles", "words", "--near-dedup-rows", str(ShardConfig.near_dedup_rows)]),
    (["--decontaminate", "e.jsonl"], ["--decontaminate-field", "text"]),
    (["--packing", "best-fit"], ["--packing-window", str(ShardConfig.packing_window)]),
], ids=["near-dedup", "decontaminate", "best-fit"])
def test_typed_at_its_default_with_its_enabling_flag_it_changes_no_byte(tmp_path, enabling, typed):
    typed_config, plain = _built(_shard(tmp_path, *enabling, *typed)), _built(_shard(tmp_path, *enabling))
    assert typed_config == plain
    assert typed_config.to_manifest_dict() == plain.to_manifest_dict()
    assert fingerprint(typed_config, "t", []) == fingerprint(plain, "t", [])
