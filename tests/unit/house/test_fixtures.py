"""The generated stand-ins for ../shared/data (tests/fixtures/) have the properties the real files are used for,
and the skip guard fails a whole-suite run with more than MAX_SKIPS skips."""
from __future__ import annotations

import os
import subprocess
import sys

import sentencepiece as spm

from tests.conftest import MAX_SKIPS, REPO
from tests.fixtures import stand_in
from tests.fixtures.sp_models import LLAMA_WHITESPACE_ORDER, WHITESPACE_SCORE
from transforms.tokenize import tokenizer_backends as tb


def test_the_llama_like_model_has_llama_2s_hard_properties():
    data = stand_in.stand_in_data()
    model = (data / "tokenizers" / "llama2-bpe-32k.model").read_bytes()
    spec = tb._spec(model)
    assert tb.model_type(model) == "bpe" and spec["normalizer"] == "identity" and spec["byte_fallback"] == 1
    assert spec["add_dummy_prefix"] == 1 and spec["remove_extra_whitespaces"] == 0
    pieces = tb.model_pieces(model)
    assert len(pieces) == 32000 and [p[0] for p in pieces[:3]] == ["<unk>", "<s>", "</s>"]
    assert sum(kind == 6 for _p, _s, kind in pieces) == 256  # byte fallback pieces <0x00>..<0xFF>
    runs = [(i, p, s) for i, (p, s, kind) in enumerate(pieces) if kind == 1 and set(p) == {"\u2581"}]
    assert [len(p) for _i, p, _s in runs] == list(LLAMA_WHITESPACE_ORDER)
    assert all(s == WHITESPACE_SCORE for _i, _p, s in runs)
    later = [s for i, (p, s, kind) in enumerate(pieces) if kind == 1 and i > runs[0][0] and set(p) != {"\u2581"}]
    assert min(later) > WHITESPACE_SCORE  # ranked after pieces with larger ids: merge order by id would differ
    sp = spm.SentencePieceProcessor(model_proto=model)
    assert sp.encode("12345", out_type=str) == ["\u2581", "1", "2", "3", "4", "5"]  # split digits
    assert sp.encode("\U0001f9ff\u0301", out_type=str)[1:] != []  # byte fallback, not <unk>
    assert sp.unk_id() not in sp.encode("\U000e0001 \u0378")
    uni = (data / "tokenizers" / "unigram-1k-test.model").read_bytes()
    assert tb.model_type(uni) == "unigram" and tb._spec(uni)["normalizer"] == "nmt_nfkc"


def test_the_stand_in_is_cached_by_digest_and_a_damaged_copy_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv(stand_in.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(stand_in, "_build", lambda root: _fake_build(root))
    first = stand_in.stand_in_data()
    assert first.parent.name == stand_in._key() and stand_in._valid(first)
    assert os.listdir(first.parent) == ["data"]  # no temporary folder left beside it
    (first / "pile" / "00.jsonl.zst").write_bytes(b"damaged")
    again = stand_in.stand_in_data()
    assert again == first and (first / "pile" / "00.jsonl.zst").read_bytes() == b"0"


def _fake_build(root):
    for i, name in enumerate(["pile/00.jsonl.zst"] + [f"other/{n}" for n in range(10)]):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(str(i).encode())
    (root / stand_in.DIGESTS).write_text(__import__("json").dumps(stand_in._digests(root)))


def _run_guard(tmp_path, skips: int, *args):
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_addoption, pytest_sessionfinish, pytest_terminal_summary\n")
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n\n@pytest.mark.parametrize('i', range(%d))\ndef test_skip(i):\n    pytest.skip('why')\n\n\n"
        "def test_ok():\n    pass\n" % skips)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "test_x.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_the_skip_guard_fails_a_whole_run_with_too_many_skips(tmp_path):
    over = _run_guard(tmp_path, MAX_SKIPS + 1, "--skip-guard")
    assert over.returncode == 1, over.stdout
    assert f"{MAX_SKIPS + 1} tests skipped, at most {MAX_SKIPS}" in over.stdout and "test_skip[0]: " in over.stdout
    assert _run_guard(tmp_path, MAX_SKIPS, "--skip-guard").returncode == 0
    assert _run_guard(tmp_path, MAX_SKIPS + 1).returncode == 0  # a partial run without the flag: no guard


# ---- hostile review of issue 34 (s37-rev34): each test below fails on 492c2ee ----
def _run_guard_module(tmp_path, body: str, *args):
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_addoption, pytest_sessionfinish, pytest_terminal_summary\n")
    (tmp_path / "test_x.py").write_text(body)
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    pass\n")  # a run that otherwise passes (exit 0)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "."],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_the_skip_guard_counts_every_test_of_a_module_skipped_at_import(tmp_path):
    """A module-level importorskip (test_exact_domain.py, test_backend_routing.py,
    test_failed_backend_not_chosen_again.py, test_report_plots.py do this) skips all its tests with ONE collect
    report: the guard counted 1 for MAX_SKIPS + 1 tests that never ran."""
    body = "import pytest\n\npytest.importorskip('no_such_module_s37')\n\n\n" + "".join(
        f"def test_{i}():\n    pass\n\n\n" for i in range(MAX_SKIPS + 1))
    over = _run_guard_module(tmp_path, body, "--skip-guard")
    assert over.returncode == 1, over.stdout


def test_the_skip_guard_counts_an_imperative_xfail(tmp_path):
    """pytest.xfail() stops the test body as pytest.skip() does, but lands in stats['xfailed'], which the guard
    does not read: MAX_SKIPS + 1 tests that never ran their assertions pass the guard."""
    body = "import pytest\n\n\n@pytest.mark.parametrize('i', range(%d))\ndef test_x(i):\n    pytest.xfail('why')\n" % (
        MAX_SKIPS + 1)
    over = _run_guard_module(tmp_path, body, "--skip-guard")
    assert over.returncode == 1, over.stdout


def test_the_naughty_stand_in_has_the_real_files_non_string_text():
    """The real lm_dataformat-naughty-strings.jsonl.zst holds a record whose "text" is a list (['testing 123',
    'testing 345'], meta {'testing': 123}), which the job dead-letters as text_not_a_string; the stand-in's four
    records are all strings, so tests/e2e/test_real_data.py::test_naughty_strings_are_handled_not_crashed loops over
    an empty manifest['dead_letters'] on a bare clone and checks no dead-letter row."""
    import json

    import zstandard

    path = stand_in.stand_in_data() / "other" / "lm_dataformat-naughty-strings.jsonl.zst"
    raw = zstandard.ZstdDecompressor().stream_reader(path.open("rb"), read_across_frames=True).read()
    texts = [json.loads(line)["text"] for line in raw.splitlines() if line.strip()]
    assert any(not isinstance(t, str) for t in texts), [type(t).__name__ for t in texts]


def test_the_stand_in_cache_key_covers_every_repo_module_the_generators_import(monkeypatch):
    """sp_models.py builds the Llama-like model with transforms/tokenize/sentencepiece_model.py's _fields, but
    stand_in._key hashes only tests/fixtures/*.py, corpus_fixtures.py and conftest.py: a change to _fields keeps
    serving the cached model built by the old code (its own digests.json still matches) on every machine that
    has the cache, while a fresh CI machine builds another."""
    import ast
    import types

    fed: list = []

    class _Recorder:
        def update(self, data):
            fed.append(bytes(data))

        def hexdigest(self):
            return "0"

    monkeypatch.setattr(stand_in, "hashlib", types.SimpleNamespace(sha256=_Recorder))
    stand_in._key()
    hashed = b"".join(fed)
    missing = []
    for path in sorted((REPO / "tests" / "fixtures").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in (
                    "transforms", "pipeline", "model_contract", "tests"):
                source = REPO / (node.module.replace(".", "/") + ".py")
                if source.is_file() and source.read_bytes() not in hashed:
                    missing.append(f"{path.name} imports {node.module}")
    assert not missing, missing
