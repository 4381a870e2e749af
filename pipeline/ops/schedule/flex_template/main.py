"""Dataflow Flex Template entry point: template parameters -> `pileprep shard ...` (+ Beam flags).

Flex Templates pass every parameter as `--name=value`. pileprep's own flags are spelled with underscores
in metadata.json (input, seq_len, incremental=true ...) and translated here; everything else (project,
region, temp_location, ...) goes to Beam unchanged.
"""
from __future__ import annotations

import sys

from pipeline.cli import main

PILEPREP_FLAGS = {"input", "output", "tokenizer", "seq_len", "num_shards", "target_shard_mb", "val_fraction",
                  "test_fraction", "seed", "text_field", "unit_mb", "max_line_mb", "staging_dir", "run_log",
                  "progress_every", "incremental"}
BOOLEAN_FLAGS = {"incremental"}


def translate(argv: list) -> list:
    out = ["shard"]
    for arg in argv:
        name, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if name in BOOLEAN_FLAGS:
            if not eq or value.lower() in ("true", "1", "yes"):
                out.append("--" + name)
        elif name in ("input", "val_input", "test_input"):  # several globs: comma separated
            out += ["--" + name.replace("_", "-"), *[v for v in value.split(",") if v]]
        elif name in PILEPREP_FLAGS:
            out.append(f"--{name.replace('_', '-')}={value}")
        else:
            out.append(arg)
    return out


if __name__ == "__main__":
    sys.exit(main(translate(sys.argv[1:])))
