"""What a command prints on stdout, for the CLI and the library forms of its commands alike.

pipeline/cli.py prints through these, and so does pipeline/shard/shard_pipeline.py's library `run`, which
therefore need not import the CLI (that import closed a cycle: cli -> shard_pipeline -> cli). With the CLI, the
only module of the service that prints (tests/unit/house/test_only_cli_prints.py).
"""
from __future__ import annotations


def print_outcome(outcome) -> None:
    """A job's outcome (pipeline/job.py: JobOutcome): the nothing-to-do line, or the run's own summary (the
    shard job's counter table)."""
    if outcome.message:
        print(f"pileprep: {outcome.message}", flush=True)
    if outcome.summary:
        print(outcome.summary, flush=True)
