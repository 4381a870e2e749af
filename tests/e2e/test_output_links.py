"""A shard run never follows a symbolic link inside its output (transforms/io/io_utils.py delete_tree,
pipeline/ops/commit.py check_no_links, pipeline/shard/resume.py reconcile): a link anywhere inside it (where the
run's generation directory goes, where pileprep writes its own bookkeeping: `generations/`, `.refs/`,
`_staging/`) is refused in one line (exit 2), its target untouched (more cases: test_links_inside_output.py); a
removal that fails is an error, never logged as done."""
from __future__ import annotations

import os
import shutil
import pathlib

import pytest

from pipeline.config import ShardConfig
from pipeline.errors import ConfigError
from pipeline.shard import shard_pipeline
from tests.corpus_fixtures import good_documents, pile_line, write_zst
from tests.ops_fixtures import FAST_LOCAL
from transforms.io import io_utils

SHARD = "train-00000-of-00001.tfrecord"


def _config(inbox, out, tokenizer) -> ShardConfig:
    return ShardConfig(inputs=(str(inbox / "*"),), output=str(out), tokenizer=tokenizer, seq_len=128, num_shards=1,
                       val_fraction=0.0, test_fraction=0.0)


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_tokenizer):
    """(inbox, generation the run writes, its manifest) from one run into a first output."""
    root = tmp_path_factory.mktemp("links")
    inbox = root / "inbox"
    inbox.mkdir()
    write_zst(inbox / "00.jsonl.zst", [pile_line(t, s) for t, s in good_documents(60_000)])
    manifest = shard_pipeline.run(_config(inbox, root / "first", tiny_tokenizer), FAST_LOCAL, progress_every_s=0)
    return inbox, manifest["generation"], manifest


def test_a_generation_directory_that_is_a_link_is_refused_not_written_through(built, tiny_tokenizer, tmp_path):
    inbox, generation, _first = built
    victim = tmp_path / "elsewhere"
    victim.mkdir()
    (victim / SHARD).write_bytes(b"a file pileprep did not create")
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(victim, out / generation)  # where the run's shards go
    with pytest.raises(ConfigError, match=f"{generation} is a symbolic link"):
        shard_pipeline.run(_config(inbox, out, tiny_tokenizer), FAST_LOCAL, progress_every_s=0)
    assert (victim / SHARD).read_bytes() == b"a file pileprep did not create"
    assert sorted(os.listdir(victim)) == [SHARD]
    assert (out / generation).is_symlink() and sorted(os.listdir(out)) == [generation]


@pytest.mark.parametrize("name", ["generations", ".refs", "_staging"])
def test_a_link_where_pileprep_keeps_its_own_files_is_refused(built, tiny_tokenizer, tmp_path, name):
    inbox, _generation, _first = built
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(elsewhere, out / name)
    with pytest.raises(ConfigError, match=f"{name} is a symbolic link"):
        shard_pipeline.run(_config(inbox, out, tiny_tokenizer), FAST_LOCAL, progress_every_s=0)
    assert os.listdir(elsewhere) == [] and sorted(os.listdir(out)) == [name]


def test_delete_tree_removes_a_link_itself_and_never_its_target(tmp_path):
    target = tmp_path / "target"
    (target / "sub").mkdir(parents=True)
    (target / "sub" / "f").write_bytes(b"kept")
    link = tmp_path / "link"
    os.symlink(target, link)
    io_utils.delete_tree(str(link))
    assert not os.path.lexists(link) and (target / "sub" / "f").read_bytes() == b"kept"
    tree = tmp_path / "tree"
    tree.mkdir()
    os.symlink(target, tree / "inner")  # a link inside a removed directory: unlinked, not followed
    io_utils.delete_tree(str(tree))
    assert not tree.exists() and (target / "sub" / "f").read_bytes() == b"kept"
    io_utils.delete_tree(str(tmp_path / "missing"))  # missing is fine


def test_a_removal_that_fails_raises_instead_of_passing_silently(tmp_path, monkeypatch):
    doomed = tmp_path / "doomed"
    doomed.mkdir()
    (doomed / "f").write_bytes(b"x")
    real_unlink = os.unlink

    def refuse(path, *args, **kwargs):  # as a read-only or busy filesystem would (root ignores permissions)
        if str(path) == "f" or str(path).endswith(os.sep + "f"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refuse)
    with pytest.raises(OSError):
        io_utils.delete_tree(str(doomed))
    assert (doomed / "f").exists()


def test_export_never_writes_through_a_link_inside_its_output(built, tmp_path):
    from pipeline.tools.export import export_parquet

    _inbox, generation, _first = built
    dataset = tmp_path / "ds"
    shutil.copytree(str(pathlib.Path(built[0]).parent / "first"), dataset)
    out = tmp_path / "parquet"
    export_parquet(str(dataset), str(out))
    parquet = sorted(p.name for p in (out / generation).iterdir())
    victim = tmp_path / "elsewhere"
    victim.mkdir()
    for name in parquet:
        (victim / name).write_bytes(b"not an export's file")
    shutil.rmtree(out / generation)
    os.symlink(victim, out / generation)
    with pytest.raises(ConfigError, match="symbolic link"):
        export_parquet(str(dataset), str(out))
    assert all((victim / name).read_bytes() == b"not an export's file" for name in parquet)


def test_a_resumable_staging_whose_generation_directory_is_a_link_is_discarded(tmp_path, caplog):
    from pipeline.shard import resume
    from tests.unit.shard.test_resume import _finished_run, _plan

    plan = _plan(tmp_path)
    _finished_run(plan)
    data = pathlib.Path(plan.data_dir)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(str(data), str(elsewhere))
    os.symlink(elsewhere, data)  # the killed run's partial generation, now a link
    found = resume.reconcile(plan)
    assert found.units == set() and found.cuts == set()
    assert any("is a symbolic link" in r.getMessage() for r in caplog.records)
    assert not os.path.lexists(data) and any(elsewhere.rglob("*.jsonl"))  # the link went, its target stayed
