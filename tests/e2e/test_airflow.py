"""The scheduled-job DAG (`pipeline/ops/schedule/airflow_dag.py`) under real Airflow.

Airflow's pins do not co-install with Beam's, so `.ci/run` gives it its own virtualenv (`.venv-airflow`, made
by `make airflow`). With it, `airflow dags test` runs the DAG's incremental shard task twice against a
SQLite metadata database: the first run commits a dataset, the second is a no-op ("nothing to do"). Paths
reach the DAG through PILEPREP_* environment variables, and an Airflow Variable overrides one at run time.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import shlex
import subprocess
import sys
import types

import jinja2
import pytest

from pipeline.cli import parse
from tests.conftest import REPO
from tests.corpus_fixtures import write_good_corpus

DAG_FILE = REPO / "pipeline" / "ops" / "schedule" / "airflow_dag.py"
AIRFLOW_VENV = pathlib.Path(os.environ.get("PILEPREP_AIRFLOW_VENV", REPO / ".venv-airflow"))
AIRFLOW = AIRFLOW_VENV / "bin" / "airflow"
DAG_ID = "pileprep_incremental_shard"


class _Variables:
    """What `{{ var.value.get(name, default) }}` sees: Airflow Variables, here a dict."""

    def __init__(self, values: dict):
        self.value = types.SimpleNamespace(get=lambda name, default=None: values.get(name, default))


def _render(command: str, variables: dict) -> list:
    return shlex.split(jinja2.Template(command).render(var=_Variables(variables)))


def _load_dag_with_stand_in(monkeypatch) -> tuple:
    """Import the DAG file against a stand-in `airflow` (the main venv has no Airflow); returns what it built."""
    built = {}

    class DAG:
        def __init__(self, dag_id, **kw):
            built["dag"] = (dag_id, kw)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class BashOperator:
        def __init__(self, task_id, bash_command, **kw):
            built["task"] = (task_id, bash_command, kw)

    modules = {"airflow": types.ModuleType("airflow"), "airflow.operators": types.ModuleType("airflow.operators"),
               "airflow.operators.bash": types.ModuleType("airflow.operators.bash")}
    modules["airflow"].DAG = DAG
    modules["airflow.operators.bash"].BashOperator = BashOperator
    for name, mod in modules.items():
        monkeypatch.setitem(sys.modules, name, mod)
    spec = importlib.util.spec_from_file_location("pileprep_dag", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, built


def test_dag_takes_paths_from_environment_and_variables(monkeypatch):
    monkeypatch.setenv("PILEPREP_OUTPUT", "/fsx/datasets/pile 2048")  # a space survives the shell
    monkeypatch.setenv("PILEPREP_EXTRA_ARGS", "--runner=DaskRunner --dask_client_address=tcp://s:8786")
    module, built = _load_dag_with_stand_in(monkeypatch)
    assert built["dag"][0] == DAG_ID and built["dag"][1]["max_active_runs"] == 1
    assert built["task"][1] == module.shard_command()
    argv = _render(module.shard_command(), {"pileprep_input": "s3://other/*.jsonl.zst"})
    args, beam_args = parse(argv[1:])  # the CLI's own parsing: a flag the CLI does not know fails here
    assert args.command == "shard" and args.incremental
    assert args.output == "/fsx/datasets/pile 2048"          # environment at parse time
    assert args.inputs == ["s3://other/*.jsonl.zst"]          # Variable at run time wins
    assert args.tokenizer == module.SETTINGS["tokenizer"]    # default
    assert "--dask_client_address=tcp://s:8786" in beam_args  # Beam options pass through (runner name resolved)
    assert any(a.startswith("--runner=") and a.endswith("DaskRunner") for a in beam_args)


def _airflow_env(home: pathlib.Path, corpus: pathlib.Path, out: pathlib.Path, tokenizer: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON"))}
    env.update({
        "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
        "PILEPREP_BIN": str(pathlib.Path(sys.executable).parent / "pileprep"),
        "PILEPREP_INPUT": str(corpus / "*"), "PILEPREP_OUTPUT": str(out), "PILEPREP_TOKENIZER": tokenizer,
        "PILEPREP_SEQ_LEN": "256", "PILEPREP_TARGET_SHARD_MB": "1", "PILEPREP_RUN_LOG": str(home / "run.jsonl"),
        "PILEPREP_EXTRA_ARGS": "--progress-every 0",
        "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE",
    })
    return env


def _airflow(env, *args, timeout_s=300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(AIRFLOW), *args], env=env, capture_output=True, text=True, timeout=timeout_s,
                          cwd=env["AIRFLOW_HOME"])
    assert proc.returncode == 0, f"airflow {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.timeout(600)
def test_real_airflow_runs_the_incremental_task_twice_second_is_a_no_op(tmp_path, tiny_tokenizer):
    if not AIRFLOW.exists():
        pytest.skip(f"real Airflow not installed at {AIRFLOW_VENV} (`make airflow`; .ci/run does it)")
    home = tmp_path / "airflow"
    (home / "dags").mkdir(parents=True)
    (home / "dags" / DAG_FILE.name).write_bytes(DAG_FILE.read_bytes())
    write_good_corpus(tmp_path / "corpus", limit_bytes=600_000, files=2)
    out = tmp_path / "dataset"
    env = _airflow_env(home, tmp_path / "corpus", out, tiny_tokenizer)
    _airflow(env, "db", "migrate")
    _airflow(env, "dags", "reserialize")  # Airflow 3 lists DAGs from the metadata DB, not the folder
    errors = _airflow(env, "dags", "list-import-errors")
    assert "airflow_dag.py" not in errors.stdout, errors.stdout
    listed = _airflow(env, "dags", "list", "--output", "json")
    table = next(line for line in listed.stdout.splitlines() if line.startswith("[{"))  # after Airflow's warnings
    assert DAG_ID in {d["dag_id"] for d in json.loads(table)}

    _airflow(env, "dags", "test", DAG_ID, "2026-11-01")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["records"]["read"] > 0 and manifest["shards"]
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}

    _airflow(env, "dags", "test", DAG_ID, "2026-11-02")
    events = [json.loads(line)["event"] for line in (home / "run.jsonl").read_text().splitlines()]
    assert events.count("committed") == 1 and events.count("nothing_to_do") == 1, events
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before  # nothing rewritten
