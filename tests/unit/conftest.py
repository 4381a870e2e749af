"""tests/unit holds fast unit tests only (issue 29: `make test-fast` runs no full Beam pipeline): inside every test
under tests/unit, `apache_beam.Pipeline.run` (or a runner's `run_pipeline` called directly) and a child process
running a whole job (`pileprep shard`, `pileprep retrieval build`; through Popen, os.system or os.posix_spawn,
also inside an `sh -c` string or a `python -c` program) fail the test. Whole commands belong in tests/e2e/ or
tests/integration/<room>/.

The guard wraps each test's setup, call and teardown (pytest calls these hooks only for items under this folder),
so a fixture of any scope that runs a pipeline while a unit test sets it up is caught too, and the collection of
each test module (a pipeline run at import, or while a parametrize list is built, fails that module's collection).

A TestPipeline (one composite transform run on a few elements with `assert_that`, the shape issue 29 asks for)
is allowed while it stays small, by one rule checked on its graph before it runs and on its cost after:
  - it reads no files through Beam (`iobase.Read`, which ReadFromText/Parquet/Avro/TFRecord expand to,
    `filebasedsource.ReadAllFiles`, which their ReadAllFrom* forms expand to, or fileio's MatchAll and
    ReadMatches): the elements come from the test's own `beam.Create`;
  - it holds no whole job: no `graph.BuildShards` (pipeline/shard/graph.py), no step labelled `ListInputs`,
    the first step of both jobs' graphs (pipeline/shard/graph.py, pipeline/retrieval/build.py), no commit step
    (WHOLE_JOB_COMMITS: only a whole job reaches one), and not both the first and the last stage of the shard
    job (a cut DoFn and a pack DoFn of pipeline/shard/stage_dofn.py): review29 ran the whole shard job under
    another first label in 0.4 s of CPU, which neither the label nor the CPU budget caught;
  - with the test's other TestPipeline runs (review29: the budget was per run, so a loop of runs passed), it
    uses at most TEST_PIPELINE_CPU_S of CPU, this process's and that of the worker processes it started
    (the in-memory runner works in this process; `--direct_running_mode=multi_processing` in children, which
    review29 found uncounted; a composite on a few elements uses ~0.4 s). CPU, not wall time: the
    machines running the tests are shared, and a wall limit would fail tests that waited for a core.
A transform count was tried and rejected: the whole default shard graph has 25 primitive steps, fewer than
near-dedup's label propagation alone (30-46 with its assert_that).

Every unit test, Beam or not, is also held to UNIT_TEST_CPU_S of CPU for its call (review of issue 29: a slow test
without Beam was not timed), this process's threads and the children it waited for (RUSAGE_CHILDREN, so a
`multiprocessing` child, spawned or forked, counts once joined). What would escape that count fails the test
instead: a thread or a child process the call started that is still there when the test's teardown ends (its
work, a pipeline included, would run on unguarded and untimed). The setup is not timed: a fixture of wider scope
is set up in the first test that needs it and shared, and the guard cannot tell the scopes' CPU apart; threads
and children started by fixtures are not checked for the same reason (a module fixture's server outlives the test
by design).
"""
from __future__ import annotations

import contextlib
import os
import re
import resource
import shlex
import subprocess
import threading
import time

import pytest

# the most CPU seconds one unit test's call may use, children included (docstring): twice the slowest unit test
# (4.9 s), so that a slower CI core is no failure
UNIT_TEST_CPU_S = 10.0
TEST_PIPELINE_CPU_S = 3.0  # the most CPU seconds one unit test's TestPipeline runs may use in all (docstring)
WHOLE_JOB_STEPS = ("ListInputs",)  # labels of a whole job's first step (docstring)
# the commit steps of the two jobs, by module and name: a graph calling one is a whole job (docstring)
WHOLE_JOB_COMMITS = {("pipeline.shard.graph", "commit_generation"), ("pipeline.retrieval.build_manifest", "commit_db")}
# (command words after the launcher) of the commands that run a whole Beam job
WHOLE_JOB_COMMANDS = (("shard",), ("retrieval", "build"))
OFFENDERS: list = []  # (nodeid, what) of every refused run, listed again in the terminal summary
SPENT: dict = {}  # nodeid -> [CPU seconds its TestPipeline runs used so far]
STARTED: dict = {}  # nodeid -> (threads, child pids) its call started, checked when its teardown ends


class FullPipelineInUnitTest(AssertionError):
    """A whole Beam pipeline or a whole-job child process inside tests/unit (move the test to tests/integration/)."""


class SlowUnitTest(AssertionError):
    """A unit test over UNIT_TEST_CPU_S, or one that left a thread or child process running (docstring)."""


def command_words(args) -> list:
    if isinstance(args, (str, bytes, os.PathLike)):
        return os.fsdecode(args).split()
    return [os.fsdecode(a) for a in args]


def _split(word: str) -> list:
    try:
        return shlex.split(word)
    except ValueError:  # an unbalanced quote: a program's text, not a command line
        return word.split()


def _is_launcher(word: str) -> bool:
    return "pipeline.cli" in word or os.path.basename(word) == "pileprep" or \
        re.search(r"\bfrom\s+pipeline\s+import\s+(?:\w+\s*,\s*)*cli\b", word) is not None


def _names_whole_job(words: list) -> bool:
    return any(tuple(words[:len(command)]) == command for command in WHOLE_JOB_COMMANDS)


def is_whole_job_command(args) -> bool:
    """True for a child that runs a whole Beam job: `python -m pipeline.cli shard ...`, `pileprep -q retrieval
    build ...`, a `python -c` child that imports pipeline.cli and is handed `shard` (tests/measured_cli.py's
    CHILD_CODE) or names it in its code, and any of these inside a word of its own (`sh -c "pileprep shard"`)."""
    words = command_words(args)
    if any(len(w.split()) > 1 and is_whole_job_command(_split(w)) for w in words):
        return True
    launcher = next((i for i, w in enumerate(words) if _is_launcher(w)), None)
    if launcher is None:
        return False
    code = words[launcher]
    quoted = re.findall(r"""['"]([\w-]+)['"]""", code)  # the command given in a program's text: main(['shard'])
    if _names_whole_job([q for q in quoted if not q.startswith("-")]):
        return True
    return _names_whole_job([w for w in words[launcher + 1:] if not w.startswith("-")])


def _refuse(nodeid: str, what: str):
    OFFENDERS.append((nodeid, what))
    raise FullPipelineInUnitTest(f"{what} inside a unit test ({nodeid}): tests/unit holds fast unit tests only; "
                                 f"move it to tests/integration/<room>/ (tests/unit/conftest.py)")


def full_pipeline_parts(pipeline) -> list:
    """What makes `pipeline` more than one small composite: (label, why) of each file read and whole job."""
    from apache_beam.io import fileio, filebasedsource, iobase
    from apache_beam.pipeline import PipelineVisitor

    from pipeline.shard.graph import BuildShards
    from pipeline.shard.stage_dofn import CutAndTokenizeFile, CutInputFile, PackStage

    found, stages = [], {}
    file_reads = (iobase.Read, fileio.MatchAll, fileio.ReadMatches, filebasedsource.ReadAllFiles)

    class Visitor(PipelineVisitor):
        def enter_composite_transform(self, node):
            self.visit_transform(node)

        def visit_transform(self, node):
            transform, label = node.transform, node.full_label
            fn = getattr(transform, "fn", None)
            if isinstance(transform, file_reads):
                found.append((label, f"a file read ({type(transform).__name__})"))
            elif isinstance(transform, BuildShards) or label.rsplit("/", 1)[-1] in WHOLE_JOB_STEPS:
                found.append((label, "a whole job"))
            elif _calls_a_commit(fn):
                found.append((label, "a whole job (its commit step)"))
            elif isinstance(fn, (CutInputFile, CutAndTokenizeFile)):  # the first stage, alone or fused
                stages.setdefault("cut", label)
            elif isinstance(fn, PackStage):
                stages.setdefault("pack", label)

    pipeline.visit(Visitor())
    if len(stages) == 2:
        found.append((stages["pack"], f"a whole job (the shard job's first stage at {stages['cut']!r} and its last)"))
    return found


def _calls_a_commit(fn) -> bool:
    """Whether a DoFn wraps one of WHOLE_JOB_COMMITS (beam.Map keeps the callable in its wrapper's closure)."""
    inner = getattr(fn, "_fn", None)
    if inner is None:
        return False
    callables = [inner] + [c.cell_contents for c in (getattr(inner, "__closure__", None) or ())
                           if callable(getattr(c, "cell_contents", None))]
    return any((getattr(c, "__module__", None), getattr(c, "__qualname__", None)) in WHOLE_JOB_COMMITS
               for c in callables)


def _cpu_s() -> float:
    """This process's CPU seconds and those of its children that ended (a multi_processing runner's workers)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _runner_classes() -> list:
    """Every PipelineRunner class loaded, the usual ones imported first: each may be called straight."""
    import importlib

    from apache_beam.runners.runner import PipelineRunner

    for module in ("apache_beam.runners.portability.fn_api_runner", "apache_beam.runners.direct.direct_runner",
                   "apache_beam.runners.portability.portable_runner"):
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    found, todo = [], [PipelineRunner]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return [c for c in found if "run_pipeline" in vars(c)]


@contextlib.contextmanager
def guarded(nodeid: str):
    """Refusals recorded in OFFENDERS (and raised where they happen) while the body runs."""
    import apache_beam
    from apache_beam.testing.test_pipeline import TestPipeline

    real_run, real_popen_init, real_system = apache_beam.Pipeline.run, subprocess.Popen.__init__, os.system
    real_spawns = {name: getattr(os, name) for name in ("posix_spawn", "posix_spawnp") if hasattr(os, name)}
    runners = {cls: vars(cls)["run_pipeline"] for cls in _runner_classes()}

    allowed = []  # Pipeline.run runs a copy made from the runner API proto: a TestPipeline's copy is allowed too
    spent = SPENT.setdefault(nodeid, [0.0])  # shared by the test's setup, call and teardown

    def guarded_run(self, *args, **kwargs):
        if allowed:
            return real_run(self, *args, **kwargs)
        if not isinstance(self, TestPipeline):
            _refuse(nodeid, "apache_beam.Pipeline.run")
        for label, why in full_pipeline_parts(self):
            _refuse(nodeid, f"a TestPipeline with {why} at {label!r}")
        allowed.append(self)
        cpu = _cpu_s()
        try:
            result = real_run(self, *args, **kwargs)
        finally:
            allowed.pop()
        spent[0] += _cpu_s() - cpu
        if spent[0] > TEST_PIPELINE_CPU_S:
            _refuse(nodeid, f"TestPipelines that used {spent[0]:.1f} s of CPU in one test (more than "
                            f"{TEST_PIPELINE_CPU_S:g})")
        return result

    def guarded_runner(real):
        def run_pipeline(self, *args, **kwargs):
            if not allowed:  # not under a TestPipeline's checked run: a runner called straight
                _refuse(nodeid, f"{type(self).__name__}.run_pipeline")
            return real(self, *args, **kwargs)
        return run_pipeline

    def check_child(args):
        if is_whole_job_command(args):
            _refuse(nodeid, f"a whole-job child process ({' '.join(command_words(args))[:120]})")

    def guarded_popen_init(self, args, *rest, **kwargs):
        check_child(args)
        return real_popen_init(self, args, *rest, **kwargs)

    def guarded_system(command):
        check_child(command)
        return real_system(command)

    def guarded_spawn(name):
        def spawn(path, argv, *rest, **kwargs):
            check_child(argv)
            return real_spawns[name](path, argv, *rest, **kwargs)
        return spawn

    apache_beam.Pipeline.run, subprocess.Popen.__init__, os.system = guarded_run, guarded_popen_init, guarded_system
    for name in real_spawns:
        setattr(os, name, guarded_spawn(name))
    for cls, real in runners.items():
        cls.run_pipeline = guarded_runner(real)
    try:
        yield
    finally:
        apache_beam.Pipeline.run, subprocess.Popen.__init__, os.system = real_run, real_popen_init, real_system
        for name, real in real_spawns.items():
            setattr(os, name, real)
        for cls, real in runners.items():
            cls.run_pipeline = real


def _children() -> set:
    """Pids of this process's children, running or exited but not yet waited for (Linux: /proc), less the helpers
    `multiprocessing` starts once and keeps for the whole session (its resource tracker, started by the first spawn
    child, and its fork server), which do no test's work."""
    import multiprocessing.forkserver
    import multiprocessing.resource_tracker

    pids = set()
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            with open(f"/proc/self/task/{task}/children", encoding="ascii") as f:
                pids.update(int(pid) for pid in f.read().split())
    helpers = (getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None),  # noqa: SLF001
               getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None))  # noqa: SLF001
    return pids - set(helpers)


def _describe_child(pid: int) -> str:
    with contextlib.suppress(OSError):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = " ".join(os.fsdecode(word) for word in f.read().split(b"\0"))
        return f"child {pid} ({command.strip()[:120]})"
    return f"child {pid}"


def _idle_helper(thread) -> bool:
    """A thread a library keeps for the whole session, doing no test's work while parked: an idle worker of Beam's
    shared pool (apache_beam.utils.thread_pool_executor, reused by the next run; the multi_processing runner leaves
    four) and tqdm's monitor (one per process, started by the first progress bar)."""
    cls = type(thread)
    if (cls.__module__, cls.__name__) == ("apache_beam.utils.thread_pool_executor", "_Worker"):
        return getattr(thread, "_work_item", None) is None
    return (cls.__module__, cls.__name__) == ("tqdm._monitor", "TMonitor")


@contextlib.contextmanager
def cpu_budget(nodeid: str, limit_s: float = None):
    """Refuses a body that used more than `limit_s` (UNIT_TEST_CPU_S) of CPU, children waited for included;
    records what threads and children it started for `check_left_running`."""
    limit_s = UNIT_TEST_CPU_S if limit_s is None else limit_s
    threads, children, cpu = set(threading.enumerate()), _children(), _cpu_s()
    try:
        yield
    finally:
        used = _cpu_s() - cpu
        STARTED[nodeid] = (set(threading.enumerate()) - threads, _children() - children)
    if used > limit_s:
        OFFENDERS.append((nodeid, f"{used:.1f} s of CPU"))
        raise SlowUnitTest(f"{nodeid} used {used:.1f} s of CPU, children included (more than {limit_s:g}): "
                           f"tests/unit holds fast unit tests only; make it faster or move it to "
                           f"tests/integration/<room>/ (tests/unit/conftest.py)")


def check_left_running(nodeid: str, grace_s: float = 5.0) -> None:
    """Refuses the threads and child processes the test's call started that are still there (after up to
    `grace_s` for those already on their way out)."""
    threads, children = STARTED.pop(nodeid, (set(), set()))
    threads = {t for t in threads if not _idle_helper(t)}
    deadline = time.monotonic() + grace_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    while children & _children() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [f"thread {t.name!r}" for t in threads if t.is_alive() and not _idle_helper(t)] + \
        [_describe_child(pid) for pid in sorted(children & _children())]
    if left:
        OFFENDERS.append((nodeid, f"left running: {', '.join(left)}"))
        raise SlowUnitTest(f"{nodeid} left running after its teardown: {', '.join(left)[:300]} (its work would go on "
                           f"unguarded and untimed: join it, or wait for it; tests/unit/conftest.py)")


@contextlib.contextmanager
def no_full_pipeline(nodeid: str):
    refused_before = len(OFFENDERS)
    with guarded(nodeid):
        yield
        if len(OFFENDERS) > refused_before:  # the test caught the refusal (a CLI turns errors into exit codes)
            raise FullPipelineInUnitTest(f"{nodeid}: {OFFENDERS[-1][1]} was refused (tests/unit/conftest.py)")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """A test module's import and its parametrize lists run here, before any test's setup."""
    refused_before = len(OFFENDERS)
    with guarded(collector.nodeid):
        report = yield
    if len(OFFENDERS) > refused_before and report.outcome != "failed":  # refused, and the refusal caught
        report.outcome = "failed"
        report.longrepr = f"{collector.nodeid}: {OFFENDERS[-1][1]} was refused (tests/unit/conftest.py)"
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with no_full_pipeline(item.nodeid):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with cpu_budget(item.nodeid), no_full_pipeline(item.nodeid):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with no_full_pipeline(item.nodeid):
        result = yield
    check_left_running(item.nodeid)
    return result


def pytest_terminal_summary(terminalreporter):
    for nodeid, what in OFFENDERS:
        terminalreporter.write_line(f"not a fast unit test in tests/unit: {nodeid}: {what}", red=True)
