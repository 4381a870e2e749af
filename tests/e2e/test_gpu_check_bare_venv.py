"""bench/gpu_check.py --tiny on a machine like the GPU machine: a fresh venv holding only torch and numpy (and the
packages torch itself imports), a plain checkout (tracked and untracked files, none of the ignored build outputs
such as model_contract's C extensions) and no install step. Nothing is downloaded: the venv reuses this
environment's torch through a directory of symlinks to just those packages, named by a `.pth` file, so
google_crc32c, Beam and TensorFlow, which sit in the same site-packages, stay out of reach (checked).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
import torch

from tests.trainer_launch import REPO

# torch's own imports on the CPU (its requirements minus the CUDA wheels, which `import torch` loads only
# where it finds them), and numpy
PACKAGES = ("torch", "functorch", "torchgen", "numpy", "numpy.libs", "typing_extensions.py", "sympy", "mpmath",
            "networkx", "jinja2", "markupsafe", "fsspec", "filelock")
ABSENT = ("google_crc32c", "apache_beam", "tensorflow", "pileprep", "zstandard")


def _bare_venv(root: Path) -> Path:
    site = Path(numpy.__file__).parent.parent
    assert Path(torch.__file__).parent.parent == site
    lib = root / "lib"
    lib.mkdir(parents=True)
    for name in PACKAGES:
        if (site / name).exists():
            (lib / name).symlink_to(site / name)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    python = root / "venv" / "bin" / "python"
    venv_site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip()
    (Path(venv_site) / "torch_numpy_only.pth").write_text(f"{lib}\n")
    return python


def _plain_checkout(dst: Path) -> Path:
    """The working tree's files that git would check out or add: no *.so, no .venv, no build/."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = REPO / name
        if not src.is_file():
            continue  # deleted in the working tree, or a submodule
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        (dst / name).write_bytes(src.read_bytes())
    assert not list(dst.rglob("*.so"))
    return dst


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return dict(env, PYTHONNOUSERSITE="1", OMP_WAIT_POLICY="PASSIVE", **extra)


@pytest.mark.timeout(420)
def test_gpu_check_tiny_in_a_torch_numpy_only_venv(tmp_path):
    python = _bare_venv(tmp_path / "bare")
    probe = subprocess.run([str(python), "-c", f"""
import importlib.util, json, torch, numpy
print(json.dumps({{m: importlib.util.find_spec(m) is not None for m in {ABSENT!r}}}))"""],
                           capture_output=True, text=True, env=_env(), timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert json.loads(probe.stdout) == {m: False for m in ABSENT}  # isolated: none of the shard job's libraries

    checkout = _plain_checkout(tmp_path / "checkout")
    # a "wheel carried beside the checkout": the trainer's subprocess must still see it (PYTHONPATH prepended,
    # not replaced); a sitecustomize on that path records every interpreter that starts with it
    carried = tmp_path / "carried"
    carried.mkdir()
    seen = tmp_path / "seen.txt"
    (carried / "sitecustomize.py").write_text(
        "import os, sys\n"
        f"open({str(seen)!r}, 'a').write(' '.join(sys.argv[:2]) + '\\n')\n")
    out = tmp_path / "out"
    p = subprocess.run([str(python), "bench/gpu_check.py", "--tiny", "--device", "cpu", "--out", str(out),
                        "--limit-scale", "3"], cwd=checkout, capture_output=True, text=True,
                       env=_env(PYTHONPATH=str(carried)), timeout=400)
    report = json.loads((out / "gpu_check.json").read_text())
    assert p.returncode == 0, ({k: v.get("error") for k, v in report.items()}, p.stderr[-2000:])
    assert all(report[s]["status"] == "ok" for s in ("versions", "step", "attention", "loader", "cli"))
    # the pure CRC-32C read every shard: no google_crc32c, no C extension in a plain checkout
    assert "crc32c pure-numpy" in p.stdout.splitlines()[:3]
    assert report["versions"]["result"]["crc32c"] == "pure-numpy"
    assert report["versions"]["result"]["modules"]["google_crc32c"] is False
    assert report["cli"]["result"]["resumed"] is True
    runs = seen.read_text().splitlines()
    assert sum("trainer.train" in r or r.startswith("-m") for r in runs) == 2, runs  # both trainer subprocesses
