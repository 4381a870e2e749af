"""The local runner's defaults and the driver-side pieces around it (no pipeline runs here).

What the shard job picks when no --runner is given, when it fuses the split and tokenize stages, how the
tokenizer model travels to workers, and how in-process workers are stopped. Output bytes across these choices
are compared in tests/e2e/test_shard_pipeline.py (test_byte_identical_across_workers_and_runners); stopping on
SIGTERM end to end in tests/e2e/test_trust_ops_runs.py.
"""
import dataclasses
import logging
import sys
import threading
import time

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.beam_glue import default_beam_args, pipeline_options
from pipeline.config import ShardConfig
from pipeline.errors import RunError
from pipeline.ops import runners
from pipeline.shard import cancel, graph, shard_pipeline
from pipeline.shard.plan import MODEL_FILE_NAME, JobPlan, stage_model
from transforms.shard.records import LedgerEntry
from tests.ops_fixtures import free_port


def test_default_runner_uses_threads_on_small_machines_and_processes_on_big_ones():
    assert default_beam_args(2) == ["--runner=FnApiRunner", "--direct_num_workers=2",
                                    "--direct_running_mode=multi_threading"]
    assert default_beam_args(16)[1:] == ["--direct_num_workers=16", "--direct_running_mode=multi_processing"]
    given = pipeline_options(["--runner=DirectRunner"]).get_all_options()
    assert given["runner"] == "DirectRunner" and not given.get("direct_running_mode", "").startswith("multi_thr")


def test_default_runner_uses_processes_from_a_raw_input_size_on_small_machines():
    from pipeline import beam_glue

    big = beam_glue.PROCESSES_FROM_RAW_BYTES
    assert beam_glue.default_running_mode(2, big - 1) == "multi_threading"
    assert beam_glue.default_running_mode(2, big) == "multi_processing"
    assert beam_glue.default_running_mode(16, 0) == "multi_processing"
    for args, raw, mode in (([], big, "multi_processing"), ([], 1 << 20, "multi_threading"),
                            (["--direct_running_mode=multi_threading"], big, None),  # the user's choice stands
                            (["--runner=FnApiRunner", "--direct_num_workers=2"], big, None)):
        options = pipeline_options(args)
        assert beam_glue.chosen_running_mode(options, args, raw) == mode
        want = mode or ("multi_threading" if "--direct_running_mode=multi_threading" in args else "in_memory")
        assert options.get_all_options()["direct_running_mode"] == want, (args, raw)


@pytest.mark.parametrize("beam_args,mode", [([], "multi_processing"),
                                             (["--direct_running_mode=multi_threading"], "multi_threading")])
def test_shard_job_picks_the_running_mode_from_its_input_before_the_pipeline_runs(monkeypatch, beam_args, mode):
    from pipeline import beam_glue

    seen = {}
    monkeypatch.setattr(shard_pipeline, "_execute", lambda plan, options, log, every: seen.setdefault(
        "mode", options.get_all_options()["direct_running_mode"]))
    job = shard_pipeline.ShardJob(_PLAN.config, beam_args)
    big = beam_glue.PROCESSES_FROM_RAW_BYTES  # raw_bytes_estimate: a plain .jsonl counts its own size
    job.execute(dataclasses.replace(_PLAN, ledger=[LedgerEntry("/in/0.jsonl", big // 2),
                                                   LedgerEntry("/in/1.jsonl", big // 2)]))
    assert seen["mode"] == mode


def _plan_with_files(files):
    """`files`: a count of equal files, or the list of their sizes."""
    sizes = [1] * files if isinstance(files, int) else files
    return dataclasses.replace(_PLAN, ledger=[LedgerEntry(f"/in/{i}.jsonl", size) for i, size in enumerate(sizes)])


_PLAN = JobPlan(ShardConfig(inputs=("x",), output="/o", tokenizer="t"), [], b"", None, "gen-0",
                "/o/gen-0", "/o/_staging/gen-0")


@pytest.mark.parametrize("files,args,spread", [
    (8, ["--runner=FnApiRunner", "--direct_num_workers=2"], False),  # 4 files per worker: fuse
    (7, ["--runner=FnApiRunner", "--direct_num_workers=2"], True),
    ([16] + [1] * 8, ["--runner=FnApiRunner", "--direct_num_workers=2"], True),  # one file > half a share
    ([2] + [1] * 8, ["--runner=FnApiRunner", "--direct_num_workers=2"], False),  # 2 <= half a share (10 / 2 / 2): fuse
    ([16] + [1] * 8, ["--runner=FnApiRunner", "--direct_num_workers=1"], False),  # one worker: nothing to even out
    (1, ["--runner=FnApiRunner", "--direct_num_workers=1"], True),  # one big file: its chunks must spread
    (4, ["--runner=DirectRunner"], False),
    (500, ["--runner=DataflowRunner"], True),  # remote: worker count unknown here, always spread
    (500, ["--runner=apache_beam.runners.dask.dask_runner.DaskRunner"], True),
])
def test_split_and_tokenize_fuse_only_when_whole_files_keep_local_workers_busy(files, args, spread):
    assert graph.spread_chunks_needed(_plan_with_files(files), PipelineOptions(args)) is spread


@pytest.mark.parametrize("files,threads,spread", [
    (8, 2, False),  # 4 files per Dask worker thread: fuse, as on the local runner
    (7, 2, True),
    ([16] + [1] * 8, 2, True),  # one file > half a share
    (8, None, True),  # no address, or the scheduler did not answer: worker count unknown, spread
])
def test_dask_fuses_split_and_tokenize_by_its_clusters_worker_threads(monkeypatch, files, threads, spread):
    asked = []
    monkeypatch.setattr(runners, "dask_cluster_threads", lambda opts: asked.append(opts["address"])
                        or threads)
    args = ["--runner=DaskRunner", "--dask_client_address=tcp://127.0.0.1:1"]
    options = pipeline_options(args)
    assert graph.spread_chunks_needed(_plan_with_files(files), options) is spread
    assert asked == ["tcp://127.0.0.1:1"]


def test_dask_cluster_threads_without_a_scheduler_is_unknown(monkeypatch):
    monkeypatch.setattr(runners, "CONNECT_TIMEOUT_S", 0.5)
    assert runners.dask_cluster_threads({}) is None
    nothing_listens = f"tcp://127.0.0.1:{free_port()}"
    assert runners.dask_cluster_threads({"dask_client_address": nothing_listens}) is None


def test_the_staged_tokenizer_model_is_checked_against_the_plan(tmp_path):
    model = b"model bytes"
    import hashlib

    contract = type("C", (), {"tokenizer": type("T", (), {"model_sha256": hashlib.sha256(model).hexdigest()})})
    plan = dataclasses.replace(_PLAN, model_bytes=model, contract=contract, staging_dir=str(tmp_path / "stage"))
    staged = stage_model(plan)
    assert staged.model_bytes == b"" and staged.tokenizer_model() == model
    (tmp_path / "stage" / MODEL_FILE_NAME).write_bytes(b"another model")
    with pytest.raises(RunError, match="does not match the plan's sha256"):
        staged.tokenizer_model()


def test_cancel_waits_for_running_calls_and_refuses_new_ones():
    cancel.reset()
    started, results = threading.Event(), []

    def stage(check):  # a stage function: checks between batches
        started.set()
        for _ in range(200):
            check()
            time.sleep(0.01)
        return "finished"

    worker = threading.Thread(target=lambda: results.append(cancel.call(stage, cancel.check)))
    worker.start()
    assert started.wait(10)
    assert cancel.cancel_and_wait(timeout_s=10)  # returns once the running call has stopped
    assert results == [None] and not worker.join(5) and not worker.is_alive()
    assert cancel.call(stage, cancel.check) is None  # new calls do not start
    cancel.reset()
    assert cancel.call(lambda: "ran") == "ran"


def test_beam_worker_errors_after_a_cancel_are_dropped_until_the_next_run(caplog):
    """A bundle still running when the runner shut down makes Beam's in-process SDK worker log an error after the
    driver's one-line message (seen in CI); once cancelled those records are dropped, and the next run logs again."""
    worker_log = logging.getLogger("apache_beam.runners.worker.sdk_worker")
    cancel.reset()
    with caplog.at_level(logging.ERROR):
        cancel.cancel_and_wait(timeout_s=1)
        worker_log.error("Error processing instruction bundle_5")
        assert "bundle_5" not in caplog.text
        cancel.reset()
        worker_log.error("Error processing instruction bundle_6")
        assert "bundle_6" in caplog.text


def test_beam_worker_tracebacks_printed_after_a_cancel_are_dropped_until_the_next_run(capsys):
    """Beam's SDK worker also `print`s the traceback of an abandoned bundle straight to sys.stderr, from its worker
    thread (seen in CI before the driver's one-line message); once cancelled only the main thread's writes pass."""
    def worker_prints(text):
        thread = threading.Thread(target=lambda: print(text, file=sys.stderr))
        thread.start()
        thread.join(5)

    cancel.reset()
    cancel.cancel_and_wait(timeout_s=1)
    worker_prints("KeyError: 'bundle_5'")
    print("pileprep: interrupted", file=sys.stderr)
    cancel.reset()
    worker_prints("KeyError: 'bundle_6'")
    err = capsys.readouterr().err
    assert "bundle_5" not in err and "pileprep: interrupted" in err and "bundle_6" in err
