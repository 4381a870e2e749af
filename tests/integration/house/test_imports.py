"""Every product module imports on its own: an import cycle, or a module that only works after another one
happened to be imported first, fails here by name.

One interpreter imports the heavy third-party packages once, then forks a child per product module; each child
starts with none of pileprep's modules imported, so "alone" holds for our code (cycles live there), and the
test takes seconds instead of a fresh Beam + torch import per module.
"""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

PACKAGES = ("model_contract", "transforms", "pipeline", "trainer")
# Needs Airflow, which has its own venv (make airflow; tests/e2e/test_airflow.py imports it there).
OPTIONAL = {"pipeline.ops.schedule.airflow_dag"}

CHILD_SCRIPT = r"""
import importlib, os, sys, traceback
heavy_packages = () if sys.argv[1] == "--no-heavy" else ("numpy", "apache_beam", "torch", "pyarrow", "sentencepiece")
for heavy in heavy_packages:
    try:
        importlib.import_module(heavy)
    except ImportError:
        pass
assert not [m for m in sys.modules if m.split(".")[0] in ("model_contract", "transforms", "pipeline", "trainer")]
bad = []
for name in sys.argv[2:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(name)
            os._exit(0)
        except BaseException:
            os.write(w, traceback.format_exc().strip().splitlines()[-1].encode()[:500])
            os._exit(1)
    os.close(w)
    message = os.read(r, 1000).decode(errors="replace")
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if status:
        bad.append(f"{name}: {message}")
print("\n".join(bad))
sys.exit(1 if bad else 0)
"""


def product_modules() -> list:
    out = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join(parts)
            if name not in OPTIONAL:
                out.append(name)
    return out


def test_every_module_imports_alone():
    modules = product_modules()
    assert "transforms.shard.pack" in modules and "trainer.train" in modules
    r = subprocess.run([sys.executable, "-c", CHILD_SCRIPT, "--heavy", *modules], capture_output=True, text=True,
                       cwd=REPO, timeout=300)
    assert r.returncode == 0, f"modules that do not import alone:\n{r.stdout}{r.stderr[-2000:]}"


def test_a_cycle_is_caught(tmp_path):
    """The check itself can fail: two modules that import each other's names at the top."""
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyc.b import B\nA = 1\n")
    (pkg / "b.py").write_text("from cyc.a import A\nB = 2\n")
    r = subprocess.run([sys.executable, "-c", CHILD_SCRIPT, "--no-heavy", "cyc.a"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 1 and "cyc.a" in r.stdout and "ImportError" in r.stdout
