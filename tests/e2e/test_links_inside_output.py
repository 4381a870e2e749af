"""A symbolic link anywhere inside an output is refused in one line (exit 2) before anything there is read,
written or removed (pipeline/ops/guards.py check_no_links_inside, reached through pipeline/ops/commit.py
check_no_links / read_committed / committed_kind, and `inspect` / `verify`): a previous or the live generation
directory, a generation manifest, a shard, the live manifest. Before, `shard` (also with --overwrite
--no-resume), `gc --yes`, `inspect` and `verify` tolerated them or read through them
(docs/wip/hostile-review-issue28.md F6)."""
from __future__ import annotations

import dataclasses
import os
import shutil

import pytest

from pipeline.errors import ConfigError
from pipeline.shard import shard_pipeline
from pipeline.tools.gc import gc
from pipeline.tools.inspect_dataset import inspect
from pipeline.tools.verify import verify
from tests.corpus_fixtures import good_documents, pile_line, write_zst
from tests.generation_history_fixtures import SHARD, copy_of, generation_history, shard_config, tree
from tests.ops_fixtures import FAST_LOCAL, run_cli

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def history(tmp_path_factory, tiny_tokenizer):
    """(dataset with generations A, B, C (live), an inbox of new input the next run would commit)."""
    root = tmp_path_factory.mktemp("links_inside")
    _inbox, dataset, gens = generation_history(root, tiny_tokenizer)
    fresh = root / "fresh"
    fresh.mkdir()
    write_zst(fresh / "new.jsonl.zst", [pile_line(t, s) for t, s in good_documents(30_000, skip=500_000)])
    return dataset, gens, fresh


def _plant(dataset, gens, case: str, elsewhere):
    """Replace one entry of `dataset` by a link to a copy of it under `elsewhere`; returns the link's relative
    path."""
    rel = {"previous generation": gens[0], "live generation": gens[2],
           "generation manifest": f"generations/{gens[0]}.manifest.json",
           "shard": f"{gens[1]}/{SHARD}", "live manifest": "manifest.json"}[case]
    target = elsewhere / rel.replace("/", "_")
    entry = dataset / rel
    shutil.move(str(entry), str(target))
    os.symlink(target, entry)
    return rel


CASES = ["previous generation", "live generation", "generation manifest", "shard", "live manifest"]


@pytest.fixture(params=CASES)
def planted(request, history, tmp_path):
    dataset, gens, fresh = history
    out = copy_of(dataset, tmp_path / "ds")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rel = _plant(out, gens, request.param, elsewhere)
    return out, rel, elsewhere, fresh


COMMANDS = {
    "shard": lambda out, fresh, tok: shard_pipeline.run(shard_config(fresh, out, tok, 1), FAST_LOCAL,
                                                        progress_every_s=0),
    "shard --overwrite --no-resume": lambda out, fresh, tok: shard_pipeline.run(
        dataclasses.replace(shard_config(fresh, out, tok, 0), overwrite=True, no_resume=True), FAST_LOCAL,
        progress_every_s=0),
    "gc --yes": lambda out, fresh, tok: gc(str(out), keep_generations=0, yes=True),
    "inspect": lambda out, fresh, tok: inspect(str(out), examples=2),
    "verify --inputs": lambda out, fresh, tok: verify(str(out), inputs=[str(fresh / "*")], sample=5),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_link_inside_the_output_is_refused_before_anything_is_read_written_or_removed(planted, command,
                                                                                        tiny_tokenizer):
    out, rel, elsewhere, fresh = planted
    before, outside = tree(out), tree(elsewhere)
    with pytest.raises(ConfigError, match=f": {rel} is a symbolic link; pileprep never reads, writes or removes"):
        COMMANDS[command](out, fresh, tiny_tokenizer)
    assert tree(out) == before and tree(elsewhere) == outside


def test_the_cli_says_it_in_one_line_with_exit_2(history, tmp_path, tiny_tokenizer):
    tok = tiny_tokenizer
    dataset, gens, fresh = history
    out = copy_of(dataset, tmp_path / "H")
    elsewhere = tmp_path / "victim"
    elsewhere.mkdir()
    rel = _plant(out, gens, "previous generation", elsewhere)
    before, outside = tree(out), tree(elsewhere)
    for args in (["gc", str(out), "--keep-generations", "0", "--yes"], ["inspect", str(out)], ["verify", str(out)],
                 ["shard", "--input", str(fresh / "*"), "--output", str(out), "--tokenizer", tok,
                  "--overwrite", "--no-resume"]):
        result = run_cli(args, timeout_s=180)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, (args, result.stderr)
        assert lines[0].startswith("pileprep: error: ") and f"{rel} is a symbolic link" in lines[0], lines
    assert tree(out) == before and tree(elsewhere) == outside


def test_verify_names_a_missing_shard_in_words_not_an_errno(history, tmp_path):
    dataset, gens, fresh = history
    out = copy_of(dataset, tmp_path / "V")
    (out / gens[2] / SHARD).unlink()
    report = verify(str(out), inputs=[str(fresh / "*")], sample=5)
    text = report.render()
    assert not report.ok and "Errno" not in text and "No such file" not in text
    assert f"shard {gens[2]}/{SHARD}: cannot be read for the audit (missing)" in text
