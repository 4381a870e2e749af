"""tests/unit/conftest.py refuses a whole Beam pipeline or a whole-job child process inside a unit test."""
from __future__ import annotations

import subprocess
import sys
import time

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from tests.unit.conftest import (OFFENDERS, FullPipelineInUnitTest, SlowUnitTest, check_left_running, cpu_budget,
                                 is_whole_job_command)


def test_a_pipeline_run_is_refused_and_a_test_pipeline_is_not():
    with pytest.raises(FullPipelineInUnitTest, match="Pipeline.run"):
        with beam.Pipeline(argv=["--runner=FnApiRunner"]) as p:
            _ = p | beam.Create([1])
    assert OFFENDERS.pop()[1] == "apache_beam.Pipeline.run"  # consumed: the guard would fail this test otherwise
    with BeamTestPipeline() as p:
        assert_that(p | beam.Create([1, 2]) | beam.Map(lambda x: x * 2), equal_to([2, 4]))


def test_a_shard_child_process_is_refused_before_it_starts():
    with pytest.raises(FullPipelineInUnitTest, match="shard"):
        subprocess.run([sys.executable, "-m", "pipeline.cli", "shard", "--help"], check=False)
    OFFENDERS.pop()
    assert subprocess.run([sys.executable, "-c", "print('shard')"], capture_output=True, check=True).stdout


@pytest.mark.parametrize(("args", "refused"), [
    ([sys.executable, "-m", "pipeline.cli", "shard", "--input", "x"], True),
    (["/venv/bin/pileprep", "shard"], True),
    ("pileprep shard --output o", True),
    ([sys.executable, "-c", "from pipeline.cli import main; main(sys.argv[1:])", "shard"], True),
    ([sys.executable, "-m", "pipeline.cli", "verify", "shard"], False),  # a path named shard, not the command
    (["pileprep", "verify", "out"], False),
    (["echo", "shard"], False),
])
def test_is_whole_job_command(args, refused):
    assert is_whole_job_command(args) is refused


def _refused(build, match: str):
    """`build(p)` on a TestPipeline is refused by the guard (the refusal is consumed so this test passes)."""
    with pytest.raises(FullPipelineInUnitTest, match=match):
        with BeamTestPipeline() as p:
            build(p)
    return OFFENDERS.pop()[1]


def test_a_test_pipeline_that_reads_files_is_refused(tmp_path):
    from apache_beam.io import fileio

    (tmp_path / "in.txt").write_text("a\nb\n")
    path = str(tmp_path / "in.txt")
    what = _refused(lambda p: p | beam.io.ReadFromText(path), "file read")
    assert "ReadFromText" in what, what
    _refused(lambda p: p | fileio.MatchFiles(path) | fileio.ReadMatches(), r"file read \(MatchAll\)")


def test_a_test_pipeline_holding_a_whole_job_is_refused():
    what = _refused(lambda p: p | "ListInputs" >> beam.Create([(0, "in.jsonl", 1)]), "whole job")
    assert "'ListInputs'" in what, what
    from pipeline.shard import graph


    class SmallShards(graph.BuildShards):  # the whole job's class, any graph: refused by what it is
        def expand(self, root):
            return root | beam.Create([1])

    what = _refused(lambda p: p | "Shard" >> SmallShards(plan=None), "whole job")
    assert "'Shard'" in what, what


def test_a_test_pipeline_over_the_cpu_budget_is_refused(monkeypatch):
    import tests.unit.conftest as guard

    monkeypatch.setattr(guard, "TEST_PIPELINE_CPU_S", 0.0)
    what = _refused(lambda p: assert_that(p | beam.Create([1]), equal_to([1])), "s of CPU")
    assert "more than 0" in what, what


@pytest.mark.parametrize("commit", [True, False], ids=["to-the-commit", "cut-to-pack"])
def test_a_whole_shard_job_under_another_first_label_is_refused(tmp_path, tiny_tokenizer, commit):
    """review29: BuildShards' body with its first step relabelled ran the whole shard job (cut, tokenize, pack,
    commit) in a TestPipeline on 60 KB in 0.4 s of CPU: neither the class, the label nor the CPU budget saw it.
    Refused by its commit step, and without one by holding the job's first and last stages."""
    from pipeline.config import ShardConfig
    from pipeline.shard import graph, shard_pipeline, unit_plan
    from tests.corpus_fixtures import good_documents, pile_line, write_zst

    write_zst(tmp_path / "in.jsonl.zst", [pile_line(t, s) for t, s in good_documents(60_000, doc_chars=1500)])
    plan = shard_pipeline.prepare(ShardConfig(inputs=(str(tmp_path / "in.jsonl.zst"),), output=str(tmp_path / "out"),
                                              tokenizer=tiny_tokenizer, seq_len=64, unit_mb=0.04))

    def whole_job(p):
        chunk_bytes = unit_plan.chunk_bytes_for(plan.ledger, plan.config.unit_bytes)
        files = p | "Inputs" >> beam.Create([(i, e.path, chunk_bytes) for i, e in enumerate(plan.ledger)])
        cuts, units = files | "Units" >> graph.CutAndTokenize(plan, True)
        shards = units | "Pack" >> graph.PackShards(plan, "files")
        if commit:
            _ = ((cuts, units, shards) | beam.Flatten() | graph.GatherAll()
                 | "Finish" >> beam.Map(graph.commit_generation, plan))

    what = _refused(whole_job, "whole job")
    assert ("Finish" if commit else "first stage") in what, what
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("manifest.json"))


def test_a_pipeline_run_straight_through_its_runner_is_refused():
    """review29: `runner.run_pipeline(p, options)` skipped Pipeline.run and so the guard."""
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    p = beam.Pipeline(runner=FnApiRunner())
    _ = p | beam.Create([1, 2]) | beam.Map(lambda x: x)
    with pytest.raises(FullPipelineInUnitTest, match="run_pipeline"):
        FnApiRunner().run_pipeline(p, p.options).wait_until_finish()
    OFFENDERS.pop()


def test_a_test_pipeline_reading_files_from_elements_is_refused(tmp_path):
    """review29: ReadAllFromText (filebasedsource.ReadAllFiles) and ReadMatches on a Create of file names read
    files through Beam without iobase.Read or fileio.MatchAll."""
    from apache_beam.io import fileio
    from apache_beam.io.filesystem import FileMetadata

    (tmp_path / "in.txt").write_text("a\nb\n")
    path = str(tmp_path / "in.txt")
    _refused(lambda p: p | beam.Create([path]) | beam.io.ReadAllFromText(), "file read")
    _refused(lambda p: p | beam.Create([FileMetadata(path, 4)]) | fileio.ReadMatches(), "file read")


@pytest.mark.parametrize("args", [
    ["sh", "-c", "pileprep shard --input x --output y"],
    ["bash", "-lc", f"cd /tmp && {sys.executable} -m pipeline.cli shard --input x"],
    [sys.executable, "-c", "import pipeline.cli as c; c.main(['shard', '--input', 'x'])"],
    [sys.executable, "-c", "from pipeline import cli; cli.main(sys.argv[1:])", "-v", "shard"],
    ["pileprep", "retrieval", "build", "--dataset", "d"],  # the retrieval job's whole Beam pipeline
    [sys.executable, "-m", "pipeline.cli", "-q", "retrieval", "build"],
], ids=["sh-c", "bash-lc", "python-c-code", "python-c-argv", "retrieval-build", "retrieval-build-m"])
def test_a_whole_job_child_hidden_in_a_shell_or_code_string_is_refused(args):
    """review29: `sh -c "pileprep shard"`, a `python -c` that calls the CLI with `shard` in its code, and the
    retrieval build (a whole Beam job too) were all let through."""
    assert is_whole_job_command(args)


def test_os_system_of_a_shard_command_is_refused():
    """review29: os.system bypassed the Popen guard."""
    import os

    with pytest.raises(FullPipelineInUnitTest, match="shard"):
        os.system("pileprep shard --input /nonexistent --output /nonexistent >/dev/null 2>&1")
    OFFENDERS.pop()


MODULE_LEVEL_RUN = '''
import apache_beam as beam

with beam.Pipeline(argv=["--runner=FnApiRunner"]) as p:  # at import: collection, before any test's setup
    _ = p | beam.Create([1])


def test_nothing():
    pass
'''


def test_a_pipeline_run_while_a_test_module_is_collected_is_refused(tmp_path):
    """review29: the guard wrapped setup, call and teardown only, so a pipeline run at a test module's import (or
    in a parametrize list built there) ran unguarded."""
    import shutil

    from tests.conftest import REPO

    shutil.copy(REPO / "tests" / "unit" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_module_level.py").write_text(MODULE_LEVEL_RUN)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                        str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    assert r.returncode != 0 and "Pipeline.run" in r.stdout, r.stdout[-3000:]


def _burn(x, seconds: float = 1.5):
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
    return x


def test_cpu_a_test_pipeline_spends_in_worker_processes_counts(monkeypatch):
    """review29: with `--direct_running_mode=multi_processing` the work runs in child processes, which
    time.process_time does not see: 3.7 CPU-s in two workers measured as 0.24 s."""
    from apache_beam.options.pipeline_options import PipelineOptions

    import tests.unit.conftest as guard

    monkeypatch.setattr(guard, "TEST_PIPELINE_CPU_S", 1.5)
    options = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=1"])
    with pytest.raises(FullPipelineInUnitTest, match="s of CPU"):
        with BeamTestPipeline(options=options) as p:
            _ = p | beam.Create([1]) | beam.Map(_burn)
    OFFENDERS.pop()


def test_the_cpu_budget_is_per_test_not_per_test_pipeline(monkeypatch):
    """review29: the budget was checked per TestPipeline run, so one test running several pipelines each under
    it (here three of 0.5 CPU-s of work against a budget of 1.2) used any CPU it liked."""
    import tests.unit.conftest as guard

    monkeypatch.setattr(guard, "TEST_PIPELINE_CPU_S", 1.2)
    with pytest.raises(FullPipelineInUnitTest, match="s of CPU"):
        for _ in range(3):
            with BeamTestPipeline() as p:
                assert_that(p | beam.Create([1]) | beam.Map(_burn, 0.5), equal_to([1]))
    OFFENDERS.pop()


def test_a_unit_test_over_the_cpu_budget_fails_beam_or_not():
    """Issue 29's review: a slow unit test that used no Beam was not timed. Every call is (cpu_budget)."""
    with pytest.raises(SlowUnitTest, match=r"s of CPU, children included \(more than 0.2\)"):
        with cpu_budget("burns", 0.2):
            _burn(None, 0.4)
    assert OFFENDERS.pop()[0] == "burns"
    with cpu_budget("idles", 0.2):
        _burn(None, 0.05)


def test_cpu_of_a_spawned_child_counts_once_joined():
    """A `multiprocessing` spawn child (its own interpreter: none of the guard's patches, not in process_time)
    counts through RUSAGE_CHILDREN when joined: this process spends almost nothing here, the child ~0.5 s."""
    import multiprocessing

    own = time.process_time()
    with pytest.raises(SlowUnitTest, match="s of CPU"):
        with cpu_budget("child", 0.25):
            child = multiprocessing.get_context("spawn").Process(target=sum, args=(range(40_000_000),))
            child.start()
            child.join()
            assert child.exitcode == 0 and time.process_time() - own < 0.25
    OFFENDERS.pop()


def test_a_thread_or_child_left_running_fails_the_test():
    """What a call leaves running would go on past the test, unguarded and untimed (a thread running a pipeline,
    a spawn child not joined): refused when the test's teardown ends (check_left_running)."""
    import multiprocessing
    import threading

    release = threading.Event()
    with cpu_budget("thread"):
        thread = threading.Thread(target=release.wait, name="left-behind", daemon=True)
        thread.start()
    with pytest.raises(SlowUnitTest, match="left running.*thread 'left-behind'"):
        check_left_running("thread", grace_s=0.1)
    OFFENDERS.pop()
    release.set()
    thread.join()
    with cpu_budget("child"):
        child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
        child.start()
    try:
        with pytest.raises(SlowUnitTest, match=f"left running.*child {child.pid}"):
            check_left_running("child", grace_s=0.1)
        OFFENDERS.pop()
    finally:
        child.kill()
        child.join()
    with cpu_budget("joined"):  # joined before the end: nothing left
        thread = threading.Thread(target=sum, args=(range(10),))
        thread.start()
        thread.join()
    check_left_running("joined", grace_s=0.1)


HOOKED = '''
import threading
import time

import conftest  # the guard under test (tests/unit/conftest.py copied beside this file)

conftest.UNIT_TEST_CPU_S = 0.3


def test_burns():
    start = time.process_time()
    while time.process_time() - start < 0.6:
        pass


def test_leaves_a_thread():
    threading.Thread(target=threading.Event().wait, name="still-here", daemon=True).start()


def test_fast():
    pass
'''


def test_the_hooks_hold_every_unit_test_to_the_budget(tmp_path):
    """The guard's hooks, not only its functions: in a pytest run under the guard, a test without Beam over the
    budget fails its call and a thread left running fails its teardown; a fast test passes."""
    import shutil

    from tests.conftest import REPO

    shutil.copy(REPO / "tests" / "unit" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_hooked.py").write_text(HOOKED)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "--rootdir",
                        str(tmp_path), str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={**__import__("os").environ, "PYTHONPATH": str(REPO)})
    out = r.stdout
    assert r.returncode == 1 and "1 failed, 2 passed, 1 error" in out, out[-3000:]
    assert "FAILED test_hooked.py::test_burns" in out and "more than 0.3" in out, out[-3000:]
    assert "ERROR test_hooked.py::test_leaves_a_thread" in out and "'still-here'" in out, out[-3000:]
    assert "PASSED test_hooked.py::test_fast" in out, out[-3000:]
