"""Command-line options derived from the config dataclasses, `--config FILE.toml`, and unknown-option checks.

One place defines each option: a dataclass field made with `pipeline.config.option(default, help, ...)`. Its
type gives the argparse type (`int`, `float`, `str`, `bool` → a switch, `Optional[X]` → X, `tuple[str, ...]`
→ one or more values, `Literal[...]` → choices), its default the default, its metadata the help text and flag
name. The same table feeds the `--config` TOML loader (keys are the flag names, with `-` or `_`), the Flex
Template's metadata.json (pipeline/ops/schedule/flex_template/) and the drift tests.

Options pileprep does not know go to Beam only if Beam's own option parser knows them, after importing the
runner named by `--runner` (runner-specific options such as `--dask_client_address` exist only then). Anything
else, and any abbreviation, is a usage error with a "did you mean".
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import importlib.util
import tomllib
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from pipeline.errors import ConfigError, UsageError


@dataclass(frozen=True)
class OptionSpec:
    name: str  # the dataclass field
    flag: str  # --seq-len
    kind: str  # "int" | "float" | "str" | "bool" | "list"
    default: Any
    help: str
    required: bool
    choices: Optional[tuple[str | int | float, ...]] = None  # a Literal's values
    metavar: Optional[str] = None
    group: Optional[str] = None
    exclusive: Optional[str] = None
    short: Optional[str] = None

    @property
    def key(self) -> str:
        """The TOML / Flex Template spelling: seq_len."""
        return self.flag[2:].replace("-", "_")

    def convert(self, value):
        """A TOML or template value (already typed or a string) → the field's type; ConfigError if it cannot."""
        try:
            if self.kind == "list":
                if isinstance(value, str):
                    value = [value]
                if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                    raise TypeError
                out = list(value)
            elif self.kind == "bool":
                if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
                    out = value.lower() in ("true", "1", "yes")
                elif isinstance(value, bool):
                    out = value
                else:
                    raise TypeError
            elif value is None:
                out = None
            elif self.kind == "int":
                if isinstance(value, bool) or isinstance(value, float):
                    raise TypeError
                out = int(value)
            elif self.kind == "float":
                if isinstance(value, bool):
                    raise TypeError
                out = float(value)
            else:
                if not isinstance(value, str):
                    raise TypeError
                out = value
        except (TypeError, ValueError):
            raise ConfigError(f"{self.flag}: expected {self._expected()}, got {value!r}") from None
        if self.choices is not None and out not in self.choices:
            raise ConfigError(f"{self.flag}: {out!r} is not one of {', '.join(map(str, self.choices))}")
        return out

    def _expected(self) -> str:
        return {"list": "a string or a list of strings", "bool": "true or false", "int": "an integer",
                "float": "a number", "str": "a string"}[self.kind]


def _unwrap(tp):
    """(kind, choices) of a resolved type hint."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    if origin is Literal:
        choices = typing.get_args(tp)
        kinds = {type(c) for c in choices}
        kind = {int: "int", float: "float", str: "str"}[kinds.pop()] if len(kinds) == 1 else "str"
        return kind, tuple(choices)
    if origin in (tuple, list) or tp in (tuple, list):
        return "list", None
    if tp is bool:
        return "bool", None
    if tp in (int, float, str):
        return tp.__name__, None
    raise TypeError(f"no command-line form for type {tp!r}")


def specs(cls) -> list:
    """The options of a config dataclass, in field order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        meta = f.metadata
        if not meta.get("cli", True):
            continue
        kind, choices = _unwrap(hints[f.name])
        if f.default is not dataclasses.MISSING:
            default, required = f.default, False
        elif f.default_factory is not dataclasses.MISSING:
            default, required = f.default_factory(), False
        else:
            default, required = None, True
        if kind == "list" and default is not None:
            default = list(default)
        out.append(OptionSpec(f.name, meta.get("flag") or "--" + f.name.replace("_", "-"), kind, default,
                              meta.get("help", ""), required, choices, meta.get("metavar"), meta.get("group"),
                              meta.get("exclusive"), meta.get("short")))
    return out


def add_options(parser: argparse.ArgumentParser, cls) -> list:
    """Add `cls`'s options to `parser` (required ones are checked after --config is merged, not by argparse)."""
    groups: dict = {}
    exclusive: dict = {}
    all_specs = specs(cls)
    for s in all_specs:
        target = parser
        if s.group:
            if s.group not in groups:
                groups[s.group] = parser.add_argument_group(s.group)
            target = groups[s.group]
        if s.exclusive:
            if s.exclusive not in exclusive:
                exclusive[s.exclusive] = target.add_mutually_exclusive_group()
            target = exclusive[s.exclusive]
        names = [s.flag] + ([s.short] if s.short else [])
        help_text = s.help + (" (required)" if s.required else "")
        kw: dict = {"dest": s.name, "default": s.default, "help": help_text}
        if s.kind == "bool":
            target.add_argument(*names, action="store_true", **kw)
            continue
        if s.kind == "list":
            kw["nargs"] = "+"
        else:
            kw["type"] = {"int": int, "float": float, "str": str}[s.kind]
        if s.choices:
            kw["choices"] = s.choices
        if s.metavar:
            kw["metavar"] = s.metavar
        target.add_argument(*names, **kw)
    return all_specs


def build(cls, namespace: argparse.Namespace):
    """The dataclass from parsed arguments; UsageError naming every missing required option."""
    all_specs = specs(cls)
    missing = [s.flag for s in all_specs if s.required and getattr(namespace, s.name, None) in (None, [], "")]
    if missing:
        raise UsageError(f"the following arguments are required: {', '.join(missing)} (on the command line or "
                         f"in --config)")
    values = {}
    for s in all_specs:
        v = getattr(namespace, s.name, s.default)
        values[s.name] = tuple(v) if s.kind == "list" and v is not None else v
    return cls(**values)


# ---------------------------------------------------------------------------------------------- --config
def load_toml(path: str, classes: tuple) -> tuple:
    """(field values, beam args) from a TOML file whose keys are the options' flag names (`seq-len` or
    `seq_len`); `beam-args` is a list of Beam options. Unknown keys and wrong types are ConfigErrors."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"--config {path}: {e}") from None
    if isinstance(data.get("shard"), dict) and len(data) == 1:  # a [shard] table is accepted too
        data = data["shard"]
    by_key = {s.key: s for cls in classes for s in specs(cls)}
    values, beam_args = {}, []
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        if key == "beam_args":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"--config {path}: beam-args must be a list of strings like '--runner=...'")
            beam_args = list(value)
            continue
        if key not in by_key:
            hint = did_you_mean(raw_key, [s.flag[2:] for s in by_key.values()] + ["beam-args"])
            raise ConfigError(f"--config {path}: unknown key {raw_key!r}{hint}")
        spec = by_key[key]
        try:
            values[spec.name] = spec.convert(value)
        except ConfigError as e:
            raise ConfigError(f"--config {path}: {e}") from None
    return values, beam_args


# --------------------------------------------------------------------------------------- unknown options
def _norm(flag: str) -> str:
    return flag.split("=", 1)[0].lstrip("-").replace("_", "-").lower()


def did_you_mean(word: str, candidates) -> str:
    """' (did you mean --x?)' for the closest candidate, or '' (difflib; a prefix of exactly one wins too)."""
    cands = sorted(set(candidates))
    norm = {_norm(c): c for c in cands}
    w = _norm(word)
    prefixed = [c for n, c in norm.items() if n.startswith(w) and len(w) >= 3]
    best = prefixed if len(prefixed) == 1 else [norm[n] for n in difflib.get_close_matches(w, list(norm), 1, 0.75)]
    if not best:
        return ""
    return f" (did you mean {best[0]}?)"


def runner_name(beam_args: list) -> Optional[str]:
    for i, a in enumerate(beam_args):
        if a.startswith("--runner="):
            return a.split("=", 1)[1]
        if a == "--runner" and i + 1 < len(beam_args):
            return beam_args[i + 1]
    return None


def import_runner(name: str) -> str:
    """Import the module of the runner named by --runner, so its own PipelineOptions subclasses register."""
    from apache_beam.runners import runner as beam_runner  # noqa: PLC0415

    path = beam_runner._RUNNER_MAP.get(name.lower(), beam_runner._RUNNER_MAP.get(name.lower() + "runner", name))  # noqa: SLF001
    if "." not in path:
        known = sorted(p.rsplit(".", 1)[-1] for p in beam_runner._RUNNER_MAP.values())  # noqa: SLF001
        raise UsageError(f"--runner={name}: no such Beam runner{did_you_mean(name, known)}")
    module = path.rsplit(".", 1)[0]
    if "dataflow" in module and importlib.util.find_spec("apitools") is None:
        raise UsageError(f"--runner={name} needs Google Cloud support, which is not installed: "
                         f"pip install 'pileprep[gcp]' (apache-beam[gcp])")
    try:
        importlib.import_module(module)
        return module
    except ImportError as e:
        if "dataflow" in module:
            raise UsageError(f"--runner={name} needs Google Cloud support: pip install 'pileprep[gcp]' "
                             f"(apache-beam[gcp]); {e}") from None
        raise UsageError(f"--runner={name}: cannot import {module} ({e})") from None


def beam_parser(runner_module: Optional[str] = None) -> argparse.ArgumentParser:
    """Beam's own option parser, abbreviations off: Beam's general options plus those of the runner named by
    --runner. Options that a runner module defines (DaskOptions, ...) count only for that runner, whatever else
    this process imported earlier, so the answer never depends on import order."""
    from apache_beam.options import pipeline_options as po  # noqa: PLC0415

    class _Checked(po._BeamArgumentParser):  # noqa: SLF001 - the parser Beam itself uses
        def error(self, message):  # a bad value for a Beam option: one line, exit 2
            raise UsageError(f"Beam option: {message}")

    parser = _Checked(allow_abbrev=False)
    subset: dict = {}
    for cls in po.PipelineOptions.__subclasses__():  # as PipelineOptions.get_all_options does
        home = cls.__module__
        if home.startswith("apache_beam.runners.") and home != runner_module:
            continue
        subset.setdefault(str(cls), cls)
    for cls in subset.values():
        cls._add_argparse_args(parser)  # noqa: SLF001
    return parser


def check_beam_args(leftovers: list, own_flags: list) -> list:
    """Leftover arguments after pileprep's options: returned unchanged if Beam knows every one of them, else
    UsageError naming the first unknown option with a did-you-mean over pileprep's and Beam's options."""
    if not leftovers:
        return []
    own_by_norm = {_norm(f): f for f in own_flags if f.startswith("--")}
    for arg in leftovers:  # `--seq_len`, `--dry_run`: pileprep's option spelled Beam's way (Beam has a --dry_run)
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and _norm(flag) in own_by_norm:
            raise UsageError(f"unrecognized option {flag} (did you mean {own_by_norm[_norm(flag)]}?)")
    name = runner_name(leftovers)
    module = import_runner(name) if name else None
    parser = beam_parser(module)
    _known, unknown = parser.parse_known_args(leftovers)
    if not unknown:
        return list(leftovers)
    beam_flags = [o for a in parser._actions for o in a.option_strings]  # noqa: SLF001
    flagged = [u for u in unknown if u.startswith("-")]
    if flagged:
        bad = flagged[0].split("=", 1)[0]
        hint = did_you_mean(bad, own_flags) or did_you_mean(bad, beam_flags)
        raise UsageError(f"unrecognized option {bad}{hint}")
    raise UsageError(f"unexpected argument {unknown[0]!r}")


# ------------------------------------------------------------------------------------ Flex Template spec
TEMPLATE_EXCLUDED = {"dry_run", "config"}  # a template launch always runs; its parameters are the config
TEMPLATE_HEADER = {
    "name": "pileprep shard",
    "description": "Tokenize, pack and shard Pile-format files into TFRecords; commit a manifest listing all "
                   "generations. Generated from pipeline/config.py by `make flex-template`.",
}


def template_parameters(classes: tuple) -> list:
    """The Flex Template's parameters (metadata.json) from the option table."""
    out = []
    for cls in classes:
        for s in specs(cls):
            if s.key in TEMPLATE_EXCLUDED:
                continue
            p = {"name": s.key, "label": s.flag[2:].replace("-", " ").capitalize(),
                 "helpText": s.help + (" Several values: comma separated." if s.kind == "list" else ""),
                 "isOptional": not s.required}
            if s.choices:
                p["regexes"] = ["^(" + "|".join(map(str, s.choices)) + ")$"]
            elif s.kind == "int":
                p["regexes"] = ["^[0-9]+$"]
            elif s.kind == "float":
                p["regexes"] = ["^[0-9]*\\.?[0-9]+([eE][-+]?[0-9]+)?$"]
            elif s.kind == "bool":
                p["regexes"] = ["^(true|false)$"]
            out.append(p)
    return out


def template_metadata() -> dict:
    from pipeline.config import RunOptions, ShardConfig  # noqa: PLC0415

    return {**TEMPLATE_HEADER, "parameters": template_parameters((ShardConfig, RunOptions))}


if __name__ == "__main__":  # python -m pipeline.options > pipeline/ops/schedule/flex_template/metadata.json
    import json
    import sys

    json.dump(template_metadata(), sys.stdout, indent=1)
    sys.stdout.write("\n")
