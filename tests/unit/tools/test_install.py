"""The install: pyproject.toml is the one place for metadata, extras and pins; setup.py only builds
the C extension; the worker Dockerfile's base image, build context and requirements agree with pyproject —
checked without a Docker daemon and without the network."""
from __future__ import annotations

import ast
import fnmatch
import functools
import importlib.metadata
import re
import subprocess
import sys
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from pipeline.config import PILEPREP_VERSION
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(60)
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
EXTRAS = PROJECT["optional-dependencies"]
# Imports that are not requirements of the package, and why.
NOT_REQUIREMENTS = {
    "airflow": "pipeline/ops/schedule/airflow_dag.py is copied into an Airflow installation",
    "sagemaker": "trainer/launch/ submits jobs from a machine with the SageMaker SDK",
}


def _reqs(lines) -> dict:
    out = {}
    for line in lines:
        r = Requirement(line)
        out.setdefault(r.name.lower(), []).append(r)
    return out


def _third_party_imports(root: str) -> set:
    """Top-level modules imported by the .py files under REPO/root that are neither stdlib nor pileprep's."""
    own = {"pipeline", "transforms", "model_contract", "trainer", "tests"}
    found = set()
    for path in (REPO / root).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in own and top != "__future__":
                    found.add(top)
    return found


@functools.lru_cache(maxsize=1)
def _module_distributions() -> dict:
    """Top-level module -> distributions: one scan of every installed distribution's files (the test venv holds
    torch and TensorFlow: a scan per imported module cost more CPU than the unit guard allows)."""
    return importlib.metadata.packages_distributions()


def _distribution_of(module: str) -> str:
    dists = _module_distributions().get(module)
    assert dists, f"{module} is imported but no installed distribution provides it"
    return dists[0].lower()


def test_python_requirement_matches_the_pins():
    assert PROJECT["requires-python"] == ">=3.11"  # numpy 2.4 and tomllib
    assert sys.version_info >= (3, 11)
    assert sys.version_info[:2] >= tuple(int(x) for x in PROJECT["requires-python"][2:].split("."))


def _closure(extra: str) -> set:
    """The extras `pileprep[extra]` installs, following self-references (pileprep[a,b] inside an extra)."""
    seen, todo = set(), [extra]
    while todo:
        for line in EXTRAS[todo.pop()]:
            r = Requirement(line)
            if r.name == "pileprep":
                new = r.extras - seen
                seen |= new
                todo.extend(new)
    return seen


def test_extras_exist_and_all_is_the_union():
    assert {"aws", "gcp", "tf", "train", "dask", "test", "all"} <= set(EXTRAS)
    base_beam = _reqs(PROJECT["dependencies"])["apache-beam"][0]
    assert "aws" in base_beam.extras  # workers read s3:// with only the base installed (--setup_file)
    for extra in ("gcp", "dask"):
        beam = _reqs(EXTRAS[extra])["apache-beam"][0]
        assert beam.extras == {extra} and beam.specifier == base_beam.specifier  # one Beam version
    assert {"boto3", "botocore"} <= set(_reqs(EXTRAS["aws"]))
    # `all` is every extra but gcp (~80 google-cloud packages that only a Dataflow driver needs), counting the
    # extras that the listed ones pull in themselves (test pulls the others it needs)
    assert _closure("all") == set(EXTRAS) - {"all", "gcp"}
    assert _reqs(EXTRAS["train"])["torch"][0].specifier == SpecifierSet("==2.13.0")


def test_pins_are_only_for_what_is_used_and_everything_used_is_required():
    indirect = PYPROJECT["tool"]["pileprep"]["indirect"]
    base = _reqs(PROJECT["dependencies"])
    # Everything the package imports comes from the base or an extra.
    provided = {name: "base" for name in base}
    for extra, lines in EXTRAS.items():
        for name in _reqs(lines):
            provided.setdefault(name, extra)
    imported = set()
    for root in ("pipeline", "transforms", "model_contract", "trainer"):
        imported |= _third_party_imports(root)
    needed = {_distribution_of(m) for m in imported - set(NOT_REQUIREMENTS)}
    missing = {d for d in needed if d not in provided and d.replace("_", "-") not in provided}
    assert not missing, f"imported but not required: {missing}"
    # Every base requirement is imported (or documented as an indirect constraint).
    imported_dists = {d.replace("_", "-") for d in needed} | {"apache-beam"}
    unused = {name for name in base if name not in imported_dists and name not in indirect}
    assert not unused, f"pinned but never imported (drop them, or say why in [tool.pileprep.indirect]): {unused}"
    # Exact pins for the libraries whose behaviour the output bytes depend on.
    for name in ("apache-beam", "sentencepiece", "zstandard"):
        assert str(base[name][0].specifier).startswith("=="), name


def test_setup_py_only_builds_the_extension_and_the_version_has_one_home():
    text = (REPO / "setup.py").read_text()
    assert "Extension(" in text and "optional=True" in text
    assert "install_requires" not in text and "==" not in text and "extras_require" not in text
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"] == "pipeline.config.PILEPREP_VERSION"
    assert "version" in PROJECT["dynamic"]
    assert importlib.metadata.version("pileprep") == PILEPREP_VERSION  # the installed metadata agrees


def _dockerfile():
    lines, buf = [], ""
    for raw in (REPO / "Dockerfile").read_text().splitlines():
        if raw.lstrip().startswith("#") or not raw.strip():
            continue
        buf += raw.rstrip("\\").strip() + " "
        if not raw.rstrip().endswith("\\"):
            lines.append(buf.strip())
            buf = ""
    return lines


def test_worker_dockerfile_matches_the_pins_and_its_build_context_exists():
    lines = _dockerfile()
    base = [l for l in lines if l.startswith("FROM ")]
    assert len(base) == 1
    m = re.fullmatch(r"FROM apache/beam_python(\d+)\.(\d+)_sdk:(\S+)", base[0])
    assert m, base[0]
    py = (int(m.group(1)), int(m.group(2)))
    beam = _reqs(PROJECT["dependencies"])["apache-beam"][0]
    assert beam.specifier.contains(m.group(3)) and str(beam.specifier) == f"=={m.group(3)}"
    assert SpecifierSet(PROJECT["requires-python"]).contains(f"{py[0]}.{py[1]}")
    ignore = [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines()
              if p.strip() and not p.startswith("#")]
    for must in (".git", ".venv", "**/*.so", "out"):
        assert must in ignore, f".dockerignore must exclude {must}"
    copied = set()
    for line in lines:
        if line.startswith("COPY "):
            *sources, _dest = line.split()[1:]
            for src in sources:
                assert (REPO / src).exists(), f"COPY {src}: not in the repository"
                assert not any(fnmatch.fnmatch(src, pat) for pat in ignore), f"COPY {src} is .dockerignored"
                copied.add(src)
    assert {"pyproject.toml", "setup.py", "README.md"} <= copied  # readme: the package's long description
    packages = {p.split(".")[0] for p in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied, f"packages not copied into the image: {packages - copied}"
    run = " ".join(l for l in lines if l.startswith("RUN "))
    extras = re.search(r"pip install [^']*'[^'\[]*\[([^\]]+)\]'", run)
    assert extras, run
    assert set(extras.group(1).split(",")) <= set(EXTRAS) and {"aws", "gcp"} <= set(extras.group(1).split(","))
    assert "_fast is not None" in run  # the build fails without the C extension
    assert "pileprep env" in run


def test_readme_flag_sets_use_the_worker_image():
    readme = (REPO / "README.md").read_text()
    assert "--sdk_container_image=" in readme and "pileprep-worker" in readme
    assert "Python ≥ 3.11" in readme and "3.10" not in readme


def test_make_help_lists_the_targets():
    res = subprocess.run(["make", "-s", "help"], cwd=str(REPO), capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    listed = {line.split()[1] for line in res.stdout.splitlines() if line.startswith("  make ")}
    assert {"setup", "shard", "test", "train", "bench", "env", "help", "flex-template", "worker-image"} <= listed
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^\$\(STAMP\): pyproject.toml", makefile, re.M)  # setup re-runs when the pins change


def test_make_setup_installs_what_make_shard_needs_and_no_torch_or_tensorflow():
    """`make setup` (what `make shard` needs) installs the `shard` extra: the pipeline, S3 and the report, never
    torch (a several-GB CUDA build from PyPI) or TensorFlow; `make setup-test` adds every test extra on top."""
    makefile = (REPO / "Makefile").read_text()
    stamp_rule = makefile[makefile.index("$(STAMP): pyproject.toml"):makefile.index("setup-test:")]
    assert re.findall(r"pip install -q -e '\.\[([a-z,]+)\]'", stamp_rule) == ["shard"]
    closure = _closure("shard") | {"shard"}
    names = set(_reqs(PROJECT["dependencies"]))
    for extra in closure:
        names |= {n for n in _reqs(EXTRAS[extra]) if n != "pileprep"}
    assert not names & {"torch", "tensorflow-cpu", "tensorflow", "faiss-cpu", "sentence-transformers"}, names
    assert "matplotlib" in names  # `make shard` ends with `pileprep report`
    test_rule = makefile[makefile.index("$(TEST_STAMP): $(STAMP)"):]
    assert "pip install -q -e '.[all]'" in test_rule.split("\n\n")[0]
    assert re.search(r"^test-deps: \$\(TEST_STAMP\)", makefile, re.M) and re.search(r"^test: test-deps", makefile, re.M)
    assert re.search(r"^test-fast: \$\(TEST_STAMP\)", makefile, re.M)
