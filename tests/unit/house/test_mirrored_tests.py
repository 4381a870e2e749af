"""Tests mirror the stage modules (issue 29: "tests move to mirror the new modules, tests/unit/shard/
test_<stage>.py"): every module of the shard stage's folders has a test file named after it somewhere under
tests/ - `test_<module>.py`, or `test_<package>_<module>.py` for a module of a sub-package (near_dedup/minhash.py:
test_near_dedup_minhash.py). A new module without one fails here by path, unless ALLOWED says where it is tested
instead.

Scope: the folders of the shard job's stages (MIRRORED). The other rooms (pipeline/tools, pipeline/retrieval,
pipeline/ops, transforms/tokenize, transforms/retrieval, model_contract, trainer) have modules tested under
other names too; they join MIRRORED as their tests are moved.
"""
from __future__ import annotations

from tests.conftest import REPO

MIRRORED = ("pipeline/shard", "pipeline/shard/near_dedup", "transforms/shard", "transforms/shard/near_dedup")

# module -> where it is tested instead (a test file of another name, or a whole-job test), or why no test of
# its own. Shrink this list: a module tested only through whole jobs (tests/e2e) is the first to get its own file.
ALLOWED = {
    # Tested as part of another module's test file (a move would split one behaviour's tests):
    "pipeline/shard/cancel.py": "tests/unit/shard/test_stage_dofn.py (the stage DoFn owns cancellation)",
    "pipeline/shard/near_dedup/band_files.py": "tests/unit/shard/test_near_dedup_windows.py",
    "pipeline/shard/near_dedup/band_index_writer.py": "tests/unit/shard/test_near_dedup_band_index.py",
    "pipeline/shard/near_dedup/committed.py": "tests/unit/shard/test_near_dedup_band_index.py",
    "pipeline/shard/near_dedup/elements.py": "tests/unit/shard/test_near_dedup_windows.py, "
                                             "tests/integration/shard/test_near_dedup_labels.py (typed elements)",
    "pipeline/shard/near_dedup/edges.py": "tests/unit/shard/test_near_dedup_windows.py",
    "transforms/shard/doc_ids.py": "tests/unit/shard/test_exact_dedup.py (the id index is exact dedup's)",
    "transforms/shard/near_dedup/paths.py": "tests/unit/shard/test_near_dedup_windows.py",
    "transforms/shard/packing_stats.py": "tests/unit/shard/test_best_fit.py (padding of both packers)",
    "transforms/shard/spill.py": "tests/unit/shard/test_tokenize_unit.py, test_exact_dedup.py",
    # Beam wiring, tested by running it (tests/e2e, tests/integration: no Beam job in tests/unit):
    "pipeline/shard/near_dedup/sign.py": "tests/e2e/test_near_dedup_pipeline.py, test_near_dedup_incremental.py",
    "pipeline/shard/near_dedup/transform.py": "tests/e2e/test_near_dedup_pipeline.py",
    "pipeline/shard/near_dedup/unit_docs.py": "tests/e2e/test_near_dedup_pipeline.py",
    "pipeline/shard/near_dedup/partitions.py": "tests/e2e/test_near_dedup_pipeline.py (every cluster found "
                                               "across partitions)",
    "pipeline/shard/runner_shuffle.py": "tests/e2e/test_export_formats.py, test_shuffle_runner.py",
    "transforms/shard/shard_shuffle.py": "tests/e2e/test_shuffle_runner.py (same shards as the file spill)",
    # Driver steps before the graph, tested through the command's refusals:
    "pipeline/shard/preflight.py": "tests/e2e/test_decontaminate_refusals.py and every exit-2 test of `shard`",
    "pipeline/shard/source_check.py": "tests/integration/tools/test_dry_run.py (unknown --source-weights sources)",
}


def _mirrored(module, test_names: set) -> bool:
    return bool({f"test_{module.stem}.py", f"test_{module.parent.name}_{module.stem}.py"} & test_names)


def test_every_stage_module_has_a_test_file_named_after_it():
    test_names = {p.name for p in (REPO / "tests").rglob("test_*.py")}
    modules = [p for room in MIRRORED for p in sorted((REPO / room).glob("*.py")) if p.name != "__init__.py"]
    assert len(modules) > 40  # the folders are there
    missing = [str(p.relative_to(REPO)) for p in modules if not _mirrored(p, test_names)]
    unlisted = [m for m in missing if m not in ALLOWED]
    assert not unlisted, (f"no tests/**/test_<module>.py for {unlisted}: move the module's tests into one, or "
                          f"say in ALLOWED (tests/unit/house/test_mirrored_tests.py) where it is tested")
    stale = sorted(set(ALLOWED) - set(missing))
    assert not stale, f"ALLOWED lists modules that have their own test file now (or are gone): {stale}"
