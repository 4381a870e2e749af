"""Tests mirror the stage modules (issue 29: "tests move to mirror the new modules, tests/unit/shard/
test_<stage>.py"): every module of the shard stage's folders has a test file named after it somewhere under
tests/ - `test_<module>.py`, or `test_<package>_<module>.py` for a module of a sub-package (near_dedup/minhash.py:
test_near_dedup_minhash.py). A new module without one fails here by path, unless ALLOWED says where it is tested
instead. A file of the right name counts only if it imports the module it mirrors (`import a.b`, `from a.b import
x`, `from a import b`, at any depth of the file): by name alone, tests/unit/trainer/test_config.py passed for
pipeline/config.py (issue 29's review).

Scope: the folders of the shard job's stages, the top-level pipeline/ modules and the rooms the refactor split
(MIRRORED). pipeline/ops and transforms/retrieval have modules tested under other names too; they join MIRRORED
as their tests are moved.
"""
from __future__ import annotations

import ast
import functools
import pathlib

import pytest

from tests.conftest import REPO

MIRRORED = ("pipeline/shard", "pipeline/shard/near_dedup", "transforms/shard", "transforms/shard/near_dedup",
            "pipeline", "pipeline/tools", "pipeline/retrieval", "model_contract", "trainer", "transforms/tokenize",
            "transforms/io")

# module -> where it is tested instead (a test file of another name, or a whole-job test), or why no test of
# its own. Shrink this list: a module tested only through whole jobs (tests/e2e) is the first to get its own file.
ALLOWED = {
    # Tested as part of another module's test file (a move would split one behaviour's tests):
    "pipeline/shard/cancel.py": "tests/unit/shard/test_stage_dofn.py (the stage DoFn owns cancellation)",
    "pipeline/shard/near_dedup/band_files.py": "tests/unit/shard/test_near_dedup_windows.py",
    "pipeline/shard/near_dedup/manifest.py": "tests/unit/shard/test_integrity.py (the section merged into the "
                                             "manifest), tests/e2e/test_near_dedup_incremental.py",
    "pipeline/shard/near_dedup/band_index_writer.py": "tests/unit/shard/test_near_dedup_band_index.py",
    "pipeline/shard/near_dedup/committed.py": "tests/unit/shard/test_near_dedup_band_index.py",
    "pipeline/shard/near_dedup/elements.py": "tests/unit/shard/test_near_dedup_windows.py, "
                                             "tests/integration/shard/test_near_dedup_labels.py (typed elements)",
    "pipeline/shard/near_dedup/edges.py": "tests/unit/shard/test_near_dedup_windows.py",
    "transforms/shard/doc_ids.py": "tests/unit/shard/test_exact_dedup.py (the id index is exact dedup's)",
    "transforms/shard/near_dedup/paths.py": "tests/unit/shard/test_near_dedup_windows.py",
    "transforms/shard/near_dedup/hashing.py": "tests/unit/shard/test_near_dedup_c.py (the C extension against it)",
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
    # The other rooms (issue 29's splits and what was there before them), where each is tested instead:
    "pipeline/config.py": "tests/unit/shard/test_config_enabling_flags.py, test_near_dedup_settings.py, "
                          "tests/e2e/test_cli.py",
    "pipeline/beam_glue.py": "tests/unit/io/test_filesystem_options.py, tests/e2e/test_local_runner.py",
    "pipeline/job.py": "tests/integration/shard/test_plan.py, tests/e2e/test_job_runner.py",
    "pipeline/options.py": "tests/e2e/test_cli.py, tests/unit/tools/test_pile_recipe.py (flags from the config)",
    "pipeline/output.py": "tests/e2e/test_observability.py (the run summary on stdout), test_cli.py",
    "pipeline/tools/environment.py": "tests/unit/tools/test_env_versions.py",
    "pipeline/tools/export_hf.py": "tests/e2e/test_export_formats.py (HF datasets opens the export)",
    "pipeline/tools/export_mds.py": "tests/e2e/test_export_formats.py (streaming opens the export)",
    "pipeline/tools/export_after_shard.py": "tests/integration/tools/test_export.py (shard --format: the exports of the committed generation)",
    "pipeline/tools/export_megatron.py": "tests/e2e/test_export_formats.py, test_export_s3.py",
    "pipeline/tools/export_verify.py": "tests/e2e/test_export_formats.py (verify of each export)",
    "pipeline/tools/gc.py": "tests/unit/ops/test_generation_chain.py, test_generation_order.py",
    "pipeline/tools/report_html.py": "tests/e2e/test_report.py (the page it renders)",
    "pipeline/tools/verify_inputs.py": "tests/unit/tools/test_verify_round_trip.py, test_rv2_verify.py",
    "pipeline/retrieval/build.py": "tests/e2e/test_retrieval_pipeline.py (Beam wiring of the build)",
    "pipeline/retrieval/cli.py": "tests/e2e/test_job_runner.py, test_trust_readers.py (`pileprep retrieval ...`)",
    "pipeline/retrieval/neighbours_sharded.py": "tests/e2e/test_retrieval_ranges_sidecar.py (R=1 vs R=4)",
    "pipeline/retrieval/show.py": "tests/e2e/test_trust_readers.py, tests/unit/ops/test_safe_text.py",
    "pipeline/retrieval/sidecar_files.py": "tests/e2e/test_retrieval_ranges_sidecar.py, test_retrieval_pipeline.py",
    "pipeline/retrieval/store.py": "tests/e2e/test_retrieval_pipeline.py, tests/unit/contract/test_manifest_check.py",
    "pipeline/retrieval/store_job.py": "tests/e2e/test_retrieval_pipeline.py (the job runner's steps)",
    "model_contract/checked_reader.py": "tests/unit/trainer/test_shard_files.py, "
                                        "tests/integration/tools/test_export.py",
    "model_contract/example_codec.py": "tests/unit/contract/test_contract.py, tests/unit/shard/test_packing.py",
    "model_contract/refs.py": "tests/unit/ops/test_generations.py",
    "model_contract/retrieval.py": "tests/unit/retrieval/test_retrieval_units.py (the sidecar codec), "
                                   "tests/unit/contract/test_manifest.py",
    "model_contract/schema.py": "tests/unit/contract/test_manifest_check.py",
    "trainer/attention.py": "tests/unit/trainer/test_trainer_kernels.py, test_varlen_bound.py",
    "trainer/batch.py": "tests/unit/trainer/test_plan.py, test_grad_sync.py (batches the trainer passes)",
    "trainer/iterable_dataset.py": "tests/integration/tools/test_export.py",
    "trainer/loss.py": "tests/unit/trainer/test_trainer_kernels.py, test_plan.py",
    "trainer/metrics.py": "tests/unit/trainer/test_progress.py, test_trainer_kernels.py",
    "trainer/parallel.py": "tests/e2e/test_trainer_layouts.py (each layout trains the same)",
    "trainer/retro.py": "tests/unit/retrieval/test_retrieval_retro.py, tests/e2e/test_trainer_retro.py",
    "trainer/tensor_parallel.py": "tests/e2e/test_trainer_layouts.py (--tp)",
    "trainer/train.py": "tests/e2e/test_trainer_launch.py, test_trainer_layouts.py",
    "transforms/tokenize/fast_encoders.py": "tests/unit/tokenize/test_tokenizer_backends.py",
    "transforms/tokenize/file_checks.py": "tests/unit/tokenize/test_tokenizer_file_checks.py",
    "transforms/tokenize/lossy_settings.py": "tests/unit/tokenize/test_lossy_tokenizer_files.py",
    "transforms/tokenize/native.py": "tests/unit/tokenize/test_panics.py",
    "transforms/tokenize/references.py": "tests/unit/tokenize/test_formats.py",
    "transforms/tokenize/spot_check.py": "tests/integration/tokenize/test_long_document_counts.py",
    "transforms/tokenize/tiktoken_file.py": "tests/unit/tokenize/test_tokenizer_file_checks.py (crafted.py files)",
    "transforms/tokenize/tokenizer.py": "tests/unit/tokenize/test_tokenizer_backends.py and most tokenize tests",
    "transforms/tokenize/tokenizer_cache.py": "tests/unit/tokenize/test_tokenizer_cache_atomic.py",
    "transforms/tokenize/tokenizer_errors.py": "one exception class, raised by every refusal in tests/unit/tokenize",
    "transforms/io/read_parquet.py": "tests/unit/io/test_parquet.py",
}


@functools.lru_cache(maxsize=None)
def _imported(test_file: pathlib.Path) -> frozenset:
    """Every dotted name a file imports, as a module or from one: `import a.b` -> a.b; `from a.b import x` ->
    a.b and a.b.x (x may be a module); `from a import b` -> a and a.b."""
    names = set()
    for node in ast.walk(ast.parse(test_file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return frozenset(names)


def unmirrored(root: pathlib.Path, rooms) -> tuple:
    """(modules of `rooms` with no test file named after them, those whose test files of that name under
    root/tests all leave the module unimported), as paths relative to `root`."""
    tests_by_name: dict = {}
    for t in sorted((root / "tests").rglob("test_*.py")):
        tests_by_name.setdefault(t.name, []).append(t)
    unnamed, unimported = [], []
    for module in [p for room in rooms for p in sorted((root / room).glob("*.py")) if p.name != "__init__.py"]:
        rel = module.relative_to(root)
        dotted = ".".join(rel.with_suffix("").parts)
        named = [t for name in (f"test_{module.stem}.py", f"test_{module.parent.name}_{module.stem}.py")
                 for t in tests_by_name.get(name, [])]
        if not named:
            unnamed.append(str(rel))
        elif not any(dotted in _imported(t) for t in named):
            unimported.append(str(rel))
    return unnamed, unimported


def test_every_stage_module_has_a_test_file_named_after_it_that_imports_it():
    modules = [p for room in MIRRORED for p in (REPO / room).glob("*.py") if p.name != "__init__.py"]
    assert len(modules) > 40  # the folders are there
    unnamed, unimported = unmirrored(REPO, MIRRORED)
    missing = unnamed + unimported
    unlisted = [m for m in unnamed if m not in ALLOWED]
    assert not unlisted, (f"no tests/**/test_<module>.py for {unlisted}: move the module's tests into one, or "
                          f"say in ALLOWED (tests/unit/house/test_mirrored_tests.py) where it is tested")
    unlisted = [m for m in unimported if m not in ALLOWED]
    assert not unlisted, (f"the tests/**/test_<module>.py named after {unlisted} do not import it: import the "
                          f"module there, or say in ALLOWED where it is tested")
    stale = sorted(set(ALLOWED) - set(missing))
    assert not stale, f"ALLOWED lists modules that have their own test file now (or are gone): {stale}"


@pytest.mark.parametrize(("test_text", "mirrors"), [
    ("import room.mod\n", True),
    ("from room.mod import thing\n", True),
    ("from room import mod\n", True),
    ("from room import other, mod as m\n", True),
    ("def test_x():\n    from room.mod import thing  # noqa: PLC0415\n", True),  # a lazy import counts
    ("", False),  # the right name and nothing else
    ("from elsewhere import mod\n", False),  # another module of the same name
    ("import room\n", False),  # the package, not the module
    ("from room.mod_two import thing\n", False),
    ("from . import mod\n", False),  # relative: not this module's dotted name
], ids=["import", "from-module", "from-package", "from-package-as", "lazy", "empty", "same-stem", "package",
        "prefix", "relative"])
def test_a_mirror_must_import_the_module_it_mirrors(tmp_path, test_text, mirrors):
    (tmp_path / "room").mkdir()
    for name in ("__init__.py", "mod.py", "other.py"):
        (tmp_path / "room" / name).write_text("")
    (tmp_path / "tests" / "unit").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "test_mod.py").write_text(test_text)
    (tmp_path / "tests" / "unit" / "test_other.py").write_text("from room import other\n")
    unnamed, unimported = unmirrored(tmp_path, ("room",))
    assert unnamed == []
    assert unimported == ([] if mirrors else ["room/mod.py"])


def test_a_module_without_a_test_file_of_its_name_is_reported_as_such(tmp_path):
    (tmp_path / "room").mkdir()
    (tmp_path / "room" / "mod.py").write_text("")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_else.py").write_text("from room import mod\n")
    assert unmirrored(tmp_path, ("room",)) == (["room/mod.py"], [])


def test_another_rooms_test_of_the_same_name_does_not_mirror_a_module(tmp_path):
    """Two modules of one stem in two rooms: each needs a test file of its name that imports it."""
    for room in ("a", "b"):
        (tmp_path / room).mkdir()
        (tmp_path / room / "config.py").write_text("")
    (tmp_path / "tests" / "b").mkdir(parents=True)
    (tmp_path / "tests" / "b" / "test_config.py").write_text("from b.config import X\n")
    assert unmirrored(tmp_path, ("a", "b")) == ([], ["a/config.py"])
