"""Airflow DAG: the nightly incremental shard run (Airflow 2.x and 3.x; copy into the dags/ folder).

The task runs `pileprep shard --incremental`: only input files the dataset does not hold yet are processed,
a run with nothing new exits 0 ("nothing to do"), a changed or removed input exits 2 and fails the task with
the files named. `max_active_runs=1` keeps one job per output. Paths and the pileprep command come from
PILEPREP_* environment variables or `pileprep_*` Airflow Variables (see SETTINGS); put Beam flags (e.g. the
Dataflow or Dask set from docs/OPERATIONS.md) in `extra_args` to run the job on a cluster instead of the
Airflow worker. Tested with real Airflow (`airflow dags test`, tests/e2e/test_airflow.py).
"""
from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow import DAG

try:  # Airflow 3
    from airflow.providers.standard.operators.bash import BashOperator
except ImportError:  # Airflow 2
    from airflow.operators.bash import BashOperator

# Where things are: defaults here, overridden by the scheduler's environment when the DAG file is parsed
# (PILEPREP_BIN, PILEPREP_INPUT, ...) and by Airflow Variables at run time (pileprep_bin, pileprep_input, ...;
# `airflow variables set pileprep_output s3://...`), so one file serves every deployment without edits.
SETTINGS = {
    "bin": "/srv/pileprep/.venv/bin/pileprep",
    "input": "s3://corpus/pile/train/*.jsonl.zst",
    "output": "s3://datasets/pile-llama2-2048",
    "tokenizer": "/srv/pileprep/tokenizers/llama2-bpe-32k.model",
    "seq_len": "2048",
    "target_shard_mb": "1024",
    "run_log": "/var/log/pileprep/shard.jsonl",
    # extra flags, shell-quoted: Beam options (e.g. the Dataflow set from docs/OPERATIONS.md) or pileprep's
    "extra_args": "",
}


def setting(name: str) -> str:
    """The value a run uses: the Airflow Variable `pileprep_<name>` if set, else $PILEPREP_<NAME>, else the default.

    Returned as a Jinja expression so the Variable is read when the task runs, not on every DAG parse."""
    default = os.environ.get(f"PILEPREP_{name.upper()}", SETTINGS[name])
    return "{{ var.value.get('pileprep_%s', %r) }}" % (name, default)


def shard_command() -> str:
    """The bash command of the task. Values come from Variables at run time; Jinja renders them before bash
    runs, so each is quoted for the shell after rendering (`| tojson` would not suit paths with spaces)."""
    quoted = {name: "'" + setting(name) + "'" for name in SETTINGS if name != "extra_args"}
    return " ".join([quoted["bin"], "shard", "--incremental", "--input", quoted["input"], "--output",
                     quoted["output"], "--tokenizer", quoted["tokenizer"], "--seq-len", quoted["seq_len"],
                     "--target-shard-mb", quoted["target_shard_mb"], "--run-log", quoted["run_log"],
                     setting("extra_args")])


with DAG(
    dag_id="pileprep_incremental_shard",
    schedule="17 3 * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=10)},
    tags=["pileprep"],
) as dag:
    shard = BashOperator(task_id="shard_incremental", bash_command=shard_command(),
                         execution_timeout=timedelta(hours=12))
