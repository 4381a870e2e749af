"""Shared fixtures: a small SentencePiece model trained here; real data from ../shared/data when present, else
generated stand-ins (tests/fixtures/); a whole-suite run fails with more than MAX_SKIPS skips."""
from __future__ import annotations

import contextlib
import os
import pathlib
import sysconfig

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# TensorFlow 2.21 and triton 3.7 (a dependency of torch 2.13's CUDA build, which is what PyPI serves) each carry
# their own LLVM: `import tensorflow; import triton` segfaults the process, the other order works (reproduced in a
# bare interpreter). The suite loads both in one process (tf.data reads shards; sentence-transformers imports
# torch._dynamo, which imports triton), so triton is loaded first. Product code never imports both: TensorFlow only
# in model_contract's tf_feature_spec helpers for tf.data users.
with contextlib.suppress(ImportError):
    import triton  # noqa: F401

REPO = pathlib.Path(__file__).resolve().parents[1]
# PILEPREP_SHARED_DATA=/nonexistent runs the suite as a bare clone does (the skip guard's own test uses it).
SHARED_DATA = pathlib.Path(os.environ.get("PILEPREP_SHARED_DATA") or REPO.parent / "shared" / "data")
MAX_SKIPS = 5  # a whole-suite run with more skips than this fails (pytest_terminal_summary below)


def shared_data_root() -> pathlib.Path:
    """../shared/data where present (real files: an extra check), else the generated stand-in with the same names
    (tests/fixtures/stand_in.py), so that no test's only copy of a path depends on the real files."""
    if SHARED_DATA.is_dir():
        return SHARED_DATA
    from tests.fixtures.stand_in import stand_in_data

    return stand_in_data()


def shared_data(*parts: str) -> pathlib.Path:
    """A file from ../shared/data, or its generated stand-in where that folder is absent."""
    path = shared_data_root().joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"{path}: neither ../shared/data nor the generated stand-in has it")
    return path


def stdlib_texts(limit_bytes: int, skip: int = 0) -> list:
    """Real text every machine with Python has: standard library sources, in a fixed order."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for path in sorted(root.glob("*.py"))[skip:]:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        out.append((path.name, text))
        total += len(text)
        if total >= limit_bytes:
            break
    return out


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory) -> str:
    """A 1,000-piece BPE model with byte fallback, trained on stdlib text (a few seconds)."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    sentences = [line for _, text in stdlib_texts(3_000_000) for line in text.splitlines() if line.strip()]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences[:60_000]), model_writer=model, vocab_size=1000, model_type="bpe",
        byte_fallback=True, pad_id=0, unk_id=1, bos_id=2, eos_id=3, normalization_rule_name="identity",
        remove_extra_whitespaces=False, num_threads=1, minloglevel=2)
    path = tmp_path_factory.mktemp("tok") / "tiny.model"
    path.write_bytes(model.getvalue())
    return str(path)


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: end-to-end run (runners, CLI, S3, crash, torchrun); tests/e2e/")
    config.addinivalue_line("markers", "unit: a unit test of one module; tests/unit/<room>/")
    config.addinivalue_line("markers", "integration: one room's modules through a whole Beam pipeline or command; "
                            "tests/integration/<room>/ (not in `make test-fast`)")
    config.addinivalue_line("markers", "retrieval_scale: compressed/re-ranked index and range-sharded neighbour search")
    config.addinivalue_line("markers", "formats: Megatron/MDS/HF export or best-fit packing, read back by each "
                            "format's own library (tests/e2e/test_export_formats.py, tests/unit/shard/test_best_fit.py)")
    config.addinivalue_line("markers", "engines: runs on a real Spark or Flink cluster (make engines); tests/e2e/")


def pytest_collection_modifyitems(config, items):
    """Markers from the folder: tests/unit/<room>/ mirrors the code (fast: no whole pipeline, tests/unit/conftest.py),
    tests/integration/<room>/ runs a room's modules through a whole pipeline, tests/e2e/ runs whole commands."""
    for item in items:
        parts = pathlib.Path(str(item.fspath)).relative_to(REPO / "tests").parts
        if parts and parts[0] in ("unit", "integration", "e2e"):
            item.add_marker(getattr(pytest.mark, parts[0]))


def pytest_addoption(parser):
    parser.addoption("--skip-guard", action="store_true",
                     help=f"fail the session when more than {MAX_SKIPS} tests skip (make test passes it)")


def skip_guard_report(skipped: list, limit: int = MAX_SKIPS) -> list:
    """Lines naming each skip (and imperative xfail: it stops a test body as a skip does) when there are more than
    `limit`; empty when within it. A module skipped at import (a module-level importorskip) is one report for
    every test it holds, a number never collected: it alone exceeds the limit."""
    counted = sum(limit + 1 if getattr(report, "when", None) == "collect" else 1
                  for report in skipped)
    if counted <= limit:
        return []
    lines = [f"skip guard: {counted} tests skipped, at most {limit} allowed (data the tests need is made by "
             f"tests/fixtures/; a skip must have a reason a bare clone cannot fix; a module skipped at import "
             f"counts as more than the limit):"]
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        lines.append(f"  {report.nodeid}: {reason}")
    return lines


def pytest_sessionfinish(session, exitstatus):
    """Runs before the terminal summary (the reporter prints it after this hook), so the exit status set here is
    the session's."""
    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if not config.getoption("--skip-guard") or reporter is None:
        return  # a partial run (-k, one file) may skip what it likes
    config._skip_guard_lines = skip_guard_report(reporter.stats.get("skipped", []) + reporter.stats.get("xfailed", []))
    if config._skip_guard_lines and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for line in getattr(config, "_skip_guard_lines", []):
        terminalreporter.write_line(line, red=True)
