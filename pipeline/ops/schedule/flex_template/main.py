"""Dataflow Flex Template entry point: template parameters -> `pileprep shard ...` (+ Beam flags).

Flex Templates pass every parameter as `--name=value`. pileprep's own options are spelled with underscores
in metadata.json (input, seq_len, incremental=true ...) and translated here; everything else (project,
region, temp_location, ...) goes to Beam unchanged. Both the parameter list in metadata.json and the set
translated here come from the config dataclasses (pipeline/options.py: `template_parameters`), so a new shard
option cannot be silently dropped; `make flex-template` regenerates metadata.json and a test fails when it is
stale.
"""
from __future__ import annotations

import sys

from pipeline.cli import main
from pipeline.config import RunOptions, ShardConfig
from pipeline.options import TEMPLATE_EXCLUDED, specs

SPECS = {s.key: s for cls in (ShardConfig, RunOptions) for s in specs(cls) if s.key not in TEMPLATE_EXCLUDED}
PILEPREP_FLAGS = set(SPECS)
BOOLEAN_FLAGS = {k for k, s in SPECS.items() if s.kind == "bool"}
LIST_FLAGS = {k for k, s in SPECS.items() if s.kind == "list"}  # several values: comma separated


def translate(argv: list) -> list:
    out = ["shard"]
    for arg in argv:
        name, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if name in BOOLEAN_FLAGS:
            if not eq or value.lower() in ("true", "1", "yes"):
                out.append(SPECS[name].flag)
        elif name in LIST_FLAGS:
            out += [SPECS[name].flag, *[v for v in value.split(",") if v]]
        elif name in PILEPREP_FLAGS:
            out.append(f"{SPECS[name].flag}={value}")
        else:
            out.append(arg)
    return out


if __name__ == "__main__":
    sys.exit(main(translate(sys.argv[1:])))
