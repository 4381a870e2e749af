"""`pileprep env` lists every tokenizer library's version: exactness depends on them."""
from __future__ import annotations

import ast
import importlib.metadata
import sys

from pipeline.tools import environment
from tests.trainer_launch import REPO


def _third_party_imports(folder) -> set:
    names = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("transforms", "model_contract")}


def test_every_library_the_tokenizers_import_is_listed():
    """Found from the code, not a hand-made list: a new format or backend's library cannot be left out."""
    dists = importlib.metadata.packages_distributions()
    imported = _third_party_imports(REPO / "transforms" / "tokenize")
    assert {"sentencepiece", "tokenizers", "tiktoken", "gigatoken", "kitoken", "splintr", "regex"} <= imported
    general = {"numpy", "apache_beam"}  # not tokenizer libraries; numpy is listed among the packages
    for name in imported - general:
        assert name in dists, f"{name} is imported by transforms/tokenize but not installed here"
        assert set(dists[name]) & set(environment.TOKENIZER_LIBRARIES), (name, dists[name])


def test_env_reports_each_tokenizer_library_version():
    report = environment.report()
    libs = report["tokenizer_libraries"]
    assert list(libs) == list(environment.TOKENIZER_LIBRARIES)
    for name, version in libs.items():
        assert version == importlib.metadata.version(name)
    text = environment.format_report(report)
    for name, version in libs.items():
        assert any(line.split() == [name, version] for line in text.splitlines()), name
    from model_contract import crc32c
    assert f"CRC-32C         {crc32c.IMPLEMENTATION}" in text.splitlines()


def test_a_missing_library_says_so():
    versions = environment.package_versions(("no-such-tokenizer-lib",))
    assert versions == {"no-such-tokenizer-lib": None}
    text = environment.format_report(dict(environment.report(), tokenizer_libraries=versions))
    assert any(line.split()[:1] == ["no-such-tokenizer-lib"] and line.endswith("- (not installed)")
               for line in text.splitlines())
