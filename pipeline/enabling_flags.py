"""Options that do nothing in the run they are given to: refused (exit 2, one line) by pipeline/config.py
ShardConfig.validate and, for what was typed, by pipeline/cli_parser.py.

An option that only shapes a stage the run does not have does nothing, so giving it is a bad configuration
(`--near-dedup-shingles tokens` without `--near-dedup` ran and ignored it). Typed on the command line it is refused
whatever its value (`--decontaminate-field text` alone asked for something that does nothing; cli_parser.py knows
what was typed). Otherwise (a --config TOML file, a ShardConfig built in code) only a value other than the default
is refused: a default written out (a TOML file listing every key) is harmless. The fields stay out of the manifest
when their stage is off (ShardConfig.to_manifest_dict), so no valid run's config or fingerprint changes.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

# (prefix of the options' fields, the enabling option, the field that enables them, its test)
ENABLERS: tuple = (("near_dedup_", "--near-dedup", "near_dedup", bool),
                   ("decontaminate_", "--decontaminate GLOB", "decontaminate", bool),
                   ("packing_window", "--packing best-fit", "packing", lambda v: v == "best-fit"),
                   ("allow_unknown_sources", "--source-weights SPEC", "source_weights", bool),
                   ("dry_run_workers", "--dry-run", "dry_run", bool))
# (field, the option that makes it do nothing, the field of that option): a dry run writes no run log and has no
# progress to report (pipeline/tools/dry_run.py)
DISABLERS: tuple = (("run_log", "--dry-run", "dry_run"), ("progress_every", "--dry-run", "dry_run"))


def _flag(name: str, value: Any) -> str:
    return f"--{name.replace('_', '-')}" + ("" if isinstance(value, bool) else f" {value}")


def orphan_option_problems(values: Mapping[str, Any], fields: Sequence[dataclasses.Field],
                           typed: frozenset = frozenset()) -> list:
    """The orphan options among `values` (field -> value: a config's fields or the parsed command line; `fields`:
    the dataclass fields they come from, for their defaults; a pair whose deciding field is absent from `values`
    is not checked); `typed`: the fields given on the command line, refused even at their default."""
    problems = []

    def given(f: dataclasses.Field) -> bool:
        return f.name in values and (values[f.name] != f.default or f.name in typed)

    for prefix, enabler, enabling_field, enabled in ENABLERS:
        test: Callable[[Any], bool] = enabled
        if enabling_field not in values or test(values[enabling_field]):
            continue
        for f in [f for f in fields if f.name.startswith(prefix) and given(f)]:
            problems.append(f"{_flag(f.name, values[f.name])} needs {enabler}: without it the option does nothing")
    for name, disabler, disabling_field in DISABLERS:
        for f in [f for f in fields if f.name == name and given(f)]:
            if values.get(disabling_field):
                problems.append(f"{_flag(name, values[name])} does nothing with {disabler}: leave one out")
    return problems
