"""Progress, summary, JSON-lines run log, and the schedule examples (cron, Airflow DAG,
Dataflow Flex Template), validated here without Airflow or Google Cloud.
"""
from __future__ import annotations

import importlib.util
import json
import pathlib
import shlex
import sys

import pytest

from pipeline.ops import progress, runlog
from pipeline.shard import shard_pipeline
from pipeline.cli import parse
from pipeline.config import ShardConfig
from pipeline.errors import ConfigError
from tests.conftest import REPO
from tests.ops_fixtures import FAST_LOCAL, real_corpus, tokenizer_path

pytestmark = pytest.mark.timeout(180)
SCHEDULE = REPO / "pipeline" / "ops" / "schedule"


# ------------------------------------------------------------------------------------------------ rates
def test_rates_and_eta_from_counters():
    counters = {"documents": 1000, "tokens": 2_000_000, "raw_bytes": 50_000_000, "input_bytes": 20_000_000,
                "split_raw_bytes": 60_000_000, "input_files": 2}
    p = progress.Progress(10.0, counters, total_input_bytes=100_000_000, total_input_files=10)
    assert p.docs_per_s == 100 and p.tokens_per_s == 200_000 and p.mb_per_s == 5.0
    # 3 bytes of text per input byte so far -> 300 MB in all, 250 MB left at 5 MB/s.
    assert p.eta_s == pytest.approx(50.0)
    assert p.fraction == pytest.approx(10 / 60)
    line = p.line()
    assert "files 2/10" in line and "(100/s)" in line and "(200,000/s)" in line and "5.00 MB/s" in line
    assert "ETA 50s" in line
    assert progress.Progress(10.0, {"documents": 5}, 0, 0).eta_s is None  # input size unknown: no ETA


def test_reporter_merges_sources_and_reports_periodically():
    ticks = iter([0.0, 2.0, 4.0])
    seen = []
    metrics = {"documents": 10, "tokens": 100}
    markers = {"documents": 12, "tokens": 90, "raw_bytes": 1000}
    rep = progress.ProgressReporter([lambda: metrics, lambda: markers, lambda: 1 / 0], 0, 1, every_s=0,
                                    on_progress=seen.append, clock=lambda: next(ticks))
    p1 = rep.poll()
    assert p1.counters == {"documents": 12, "tokens": 100, "raw_bytes": 1000} and p1.elapsed_s == 2.0
    rep.poll()
    assert len(seen) == 2 and seen[1].elapsed_s == 4.0


def test_display_refreshes_one_line_on_a_terminal_and_prints_lines_otherwise():
    import io
    import logging

    counters = {"documents": 500, "tokens": 90_000, "raw_bytes": 4_000_000, "input_bytes": 1_000_000,
                "split_raw_bytes": 8_000_000, "dead_letters": 7, "input_files": 1}
    p = progress.Progress(4.0, counters, total_input_bytes=2_000_000, total_input_files=2)
    record = logging.LogRecord("pileprep.progress", logging.INFO, __file__, 1, "progress", (), None)
    record.progress = p
    term, plain = io.StringIO(), io.StringIO()
    tty, lines = progress.Display(term, tty=True), progress.Display(plain, tty=False)
    for _ in range(3):
        tty.emit(record)
        lines.emit(record)
    tty.finish()
    assert term.getvalue().count("\r\x1b[K") == 3 and term.getvalue().count("\n") == 1  # one line, redrawn
    bar = term.getvalue().split("\r\x1b[K")[-1]
    assert "[" in bar and "%" in bar and "500 docs 125/s" in bar and "22,500 tok/s" in bar and "dead 7" in bar
    assert "ETA" in bar and "1.00 MB/s" in bar
    assert plain.getvalue().count("\n") == 3 and "\r" not in plain.getvalue()
    assert all(l.startswith(progress.Display.PREFIX) and "dead letters 7" in l
               for l in plain.getvalue().splitlines())
    other = logging.LogRecord("pileprep", logging.WARNING, __file__, 1, "not progress", (), None)
    lines.emit(other)  # only progress records are shown by the display
    assert plain.getvalue().count("\n") == 3


def test_summary_table_lists_every_counter_with_rate():
    table = progress.summary_table({"documents": 20, "tokens": 4000}, 2.0)
    assert "documents" in table and "2,000.0" in table and "wall time" in table


# ------------------------------------------------------------------------------------------- end to end
def test_run_log_has_every_event_and_counter(tmp_path, capsys):
    corpus = real_corpus(tmp_path / "corpus", names=("pile/00.jsonl.zst", "other/arxiv.jsonl"))
    log_path = tmp_path / "logs" / "run.jsonl"
    cfg = ShardConfig(inputs=(str(corpus / "*"),), output=str(tmp_path / "out"), tokenizer=tokenizer_path(),
                      seq_len=256, num_shards=2, unit_mb=0.1)
    manifest = shard_pipeline.run(cfg, FAST_LOCAL, run_log=str(log_path), progress_every_s=0.2)
    out = capsys.readouterr().out
    events = runlog.read_run_log(str(log_path))
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[1] == "plan" and kinds[-2:] == ["committed", "summary"]
    assert "progress" in kinds
    assert len({e["run_id"] for e in events}) == 1 and all("ts" in e for e in events)
    ticks = [e for e in events if e["event"] == "progress"]
    for a, b in zip(ticks, ticks[1:]):  # counters only grow
        assert all(b["counters"][k] >= v for k, v in a["counters"].items())
        assert {"docs_per_s", "tokens_per_s", "mb_per_s", "eta_s"} <= set(b)
    summary = events[-1]
    c = summary["counters"]
    assert set(progress.COUNTERS) <= set(c)
    assert c["input_files"] == 2 and c["records"] == manifest["records"]["read"]
    assert c["examples"] == sum(s["examples"] for s in manifest["shards"])
    assert c["input_bytes"] == sum(p.stat().st_size for p in corpus.iterdir())
    assert summary["wall_s"] > 0 and summary["tokens_per_s"] > 0 and summary["mb_per_s"] > 0
    assert events[-2]["shards"] == len(manifest["shards"])
    assert "per second" in out and "tokens" in out  # the final summary table


def test_run_log_records_errors(tmp_path):
    log_path = tmp_path / "run.jsonl"
    cfg = ShardConfig(inputs=(str(tmp_path / "missing" / "*"),), output=str(tmp_path / "out"),
                      tokenizer=tokenizer_path(), seq_len=256)
    with pytest.raises(ConfigError):
        shard_pipeline.run(cfg, FAST_LOCAL, run_log=str(log_path), progress_every_s=0)
    events = runlog.read_run_log(str(log_path))
    assert [e["event"] for e in events] == ["start", "error"]
    assert events[-1]["type"] == "ConfigError" and "nothing matches" in events[-1]["message"]


# -------------------------------------------------------------------------------------------- schedules
def _parse_shard(argv):
    """The CLI's own parsing: unknown options (a flag set drifting from the CLI) are a UsageError."""
    args, beam_args = parse(argv)
    assert args.command == "shard"
    return args, beam_args


def test_cron_line_is_valid_and_runs_an_incremental_shard():
    lines = [l for l in (SCHEDULE / "pileprep.cron").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert len(lines) == 1
    fields = lines[0].split(None, 5)
    ranges = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
    for f, (lo, hi) in zip(fields[:5], ranges):
        assert f == "*" or lo <= int(f) <= hi, f
    assert "%" not in fields[5]  # cron would turn it into a newline
    words = shlex.split(fields[5])
    cmd = words[words.index(next(w for w in words if w.endswith("/bin/pileprep"))) + 1:]
    cmd = cmd[:cmd.index(">>")] if ">>" in cmd else cmd
    args, beam_args = _parse_shard(cmd)
    assert args.incremental and args.run_log and not beam_args


def test_flex_template_spec_maps_onto_the_cli():
    meta = json.loads((SCHEDULE / "flex_template" / "metadata.json").read_text())
    spec = importlib.util.spec_from_file_location("flex_main", SCHEDULE / "flex_template" / "main.py")
    flex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flex)
    names = {p["name"] for p in meta["parameters"]}
    assert names <= flex.PILEPREP_FLAGS
    required = [p["name"] for p in meta["parameters"] if not p.get("isOptional")]
    sample = {"input": "gs://c/a/*.jsonl.zst,gs://c/b/*.jsonl.zst", "output": "gs://d/pile", "tokenizer": "/t/m.model",
              "seq_len": "2048", "target_shard_mb": "512", "incremental": "true", "run_log": "gs://d/log.jsonl"}
    assert set(required) <= set(sample)
    argv = flex.translate([f"--{k}={v}" for k, v in sample.items()] + ["--project=p", "--region=europe-west4",
                                                                        "--temp_location=gs://d/tmp"])
    args, beam_args = _parse_shard(argv)
    assert args.inputs == ["gs://c/a/*.jsonl.zst", "gs://c/b/*.jsonl.zst"] and args.seq_len == 2048
    assert args.incremental and args.target_shard_mb == 512.0
    assert beam_args == ["--project=p", "--region=europe-west4", "--temp_location=gs://d/tmp"]
    assert not flex.translate(["--incremental=false"])[1:]
    assert pathlib.Path(SCHEDULE / "flex_template" / "Dockerfile").read_text().count("FLEX_TEMPLATE_PYTHON_PY_FILE")


def test_flex_template_metadata_is_generated_from_the_config():
    """Drift test: metadata.json lists every shard option (it once lacked --source-field, which Dataflow then
    dropped silently); `make flex-template` regenerates it."""
    from pipeline import options
    from pipeline.config import RunOptions

    meta = json.loads((SCHEDULE / "flex_template" / "metadata.json").read_text())
    assert meta == options.template_metadata(), "stale metadata.json: run `make flex-template`"
    names = {p["name"] for p in meta["parameters"]}
    assert "source_fields" not in names and "source_field" in names
    every = {s.key for cls in (ShardConfig, RunOptions) for s in options.specs(cls)} - options.TEMPLATE_EXCLUDED
    assert names == every
    spec = importlib.util.spec_from_file_location("flex_main", SCHEDULE / "flex_template" / "main.py")
    flex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flex)
    argv = flex.translate(["--input=gs://c/*.zst", "--output=gs://d", "--tokenizer=/t.model",
                           "--source_field=meta.pile_set_name,source", "--text_field=content"])
    args, beam_args = _parse_shard(argv)
    assert args.source_fields == ["meta.pile_set_name", "source"] and args.text_field == "content"
    assert not beam_args


# ----------------------------------------------------------------------------- what a user sees
def test_a_normal_shard_run_keeps_stderr_short_and_shows_progress(tmp_path):
    """Default runner (FnApiRunner, 2 worker processes), stderr not a terminal: plain progress lines with rates
    and dead letters, at most 15 other lines (Beam's ~45 INFO lines go to the worker log), summary on stdout."""
    from tests.ops_fixtures import run_cli

    corpus = real_corpus(tmp_path / "corpus", names=("pile/00.jsonl.zst", "pile/val.jsonl.zst"))
    out = tmp_path / "out"
    res = run_cli(["shard", "--input", str(corpus / "*"), "--output", str(out), "--tokenizer", tokenizer_path(),
                   "--seq-len", "256", "--num-shards", "2", "--progress-every", "0.2"], timeout_s=170)
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stderr.splitlines()
    progress_lines = [l for l in lines if l.startswith(progress.Display.PREFIX)]
    other = [l for l in lines if not l.startswith(progress.Display.PREFIX)]
    assert len(other) <= 15, other
    assert progress_lines and all(k in progress_lines[-1] for k in ("docs", "/s", "MB/s", "ETA", "dead letters"))
    assert "\r" not in res.stderr  # not a terminal: no in-place refresh
    assert "per second" in res.stdout and "records: read" in res.stdout  # the summaries
    assert not list(out.rglob("*.log"))  # the worker log is removed after a successful run


def test_quiet_shows_no_progress(tmp_path):
    from tests.ops_fixtures import run_cli

    corpus = real_corpus(tmp_path / "corpus", names=("pile/val.jsonl.zst",))
    # a neutral name: an input named val/test passed as --input is warned about, even under -q
    (corpus / "val.jsonl.zst").rename(corpus / "part-0.jsonl.zst")
    res = run_cli(["shard", "--input", str(corpus / "*"), "--output", str(tmp_path / "out"), "--tokenizer",
                   tokenizer_path(), "--seq-len", "256", "-q", *FAST_LOCAL], timeout_s=120)
    assert res.returncode == 0 and res.stderr == "", res.stderr[-2000:]


FAILING_RUN = """
import os, subprocess, sys
from pipeline.shard import shard_pipeline
def fake_run(config, beam_args=None, **kw):
    os.makedirs(os.path.join(config.output, "_staging"), exist_ok=True)  # a real run creates its staging root
    subprocess.run([sys.executable, "-c", "import sys; [print('worker line', i, file=sys.stderr) for i in range(60)]"])
    print("driver noise", file=sys.stderr)
    raise RuntimeError("a worker crashed")
shard_pipeline.run_outcome = fake_run
from pipeline.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_failed_run_prints_the_worker_log_tail_and_keeps_it_in_staging(tmp_path):
    import subprocess

    from tests.ops_fixtures import subprocess_env

    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-c", FAILING_RUN, "shard", "--input", "x", "--output", str(out),
                          "--tokenizer", "t"], capture_output=True, text=True, timeout=120,
                         env=subprocess_env(PYTHONPATH=str(REPO)), cwd=str(REPO))
    assert res.returncode == 1, res.stderr
    err = res.stderr.splitlines()
    assert err[-1].startswith("pileprep: failed: RuntimeError: a worker crashed")
    assert "worker line 59" in res.stderr and "worker line 0\n" not in res.stderr  # only the tail
    assert len(err) <= 25 and "Traceback" not in res.stderr
    logs = list((out / "_staging" / "logs").glob("*.log"))
    assert len(logs) == 1 and str(logs[0]) in res.stderr
    kept = logs[0].read_text()
    assert "worker line 0\n" in kept and "driver noise" in kept and "Traceback" in kept  # the whole story
