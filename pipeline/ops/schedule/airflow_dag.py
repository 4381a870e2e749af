"""Airflow DAG: the nightly incremental shard run (Airflow 2.x and 3.x; copy into the dags/ folder).

The task runs `pileprep shard --incremental`: only input files the dataset does not hold yet are processed,
a run with nothing new exits 0 ("nothing to do"), a changed or removed input exits 2 and fails the task with
the files named. `max_active_runs=1` keeps one job per output. Add Beam flags (e.g. the Dataflow set from
docs/OPERATIONS.md) to BEAM_ARGS to run the job on a cluster instead of the Airflow worker.
"""
from __future__ import annotations

import shlex
from datetime import datetime, timedelta

from airflow import DAG

try:  # Airflow 3
    from airflow.providers.standard.operators.bash import BashOperator
except ImportError:  # Airflow 2
    from airflow.operators.bash import BashOperator

PILEPREP = "/srv/pileprep/.venv/bin/pileprep"
SHARD_ARGS = ["shard", "--incremental", "--input", "s3://corpus/pile/train/*.jsonl.zst",
              "--output", "s3://datasets/pile-llama2-2048", "--tokenizer", "/srv/pileprep/tokenizers/llama2-bpe-32k.model",
              "--seq-len", "2048", "--target-shard-mb", "1024", "--run-log", "/var/log/pileprep/shard.jsonl"]
BEAM_ARGS: list = []  # e.g. ["--runner=DataflowRunner", "--project=...", "--region=...", ...]


def shard_command() -> str:
    return " ".join(shlex.quote(a) for a in [PILEPREP, *SHARD_ARGS, *BEAM_ARGS])


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
