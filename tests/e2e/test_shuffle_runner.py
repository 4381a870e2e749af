"""The runner's shuffle (docs/SHUFFLE.md, design D) writes the same dataset as the file spill.

`--shuffle runner` moves per-shard pieces through a GroupByKey instead of having every pack task read every
unit's spill files; the dataset (shards, id index, manifest) must be byte-identical, including cross-split
dedup and shards no document falls in. `auto` picks per runner.
"""
from __future__ import annotations

import pathlib
import random

import numpy as np
import pytest

from pipeline.config import ShardConfig
from pipeline.errors import ConfigError
from pipeline.ops import runlog, runners
from pipeline.shard import shard_pipeline
from tests.corpus_fixtures import good_documents, pile_line, write_good_corpus, write_zst
from tests.conftest import REPO
from tests.ops_fixtures import (FAST_LOCAL, dataset_files, portable_args, run_cli, start_portable_services,
                                subprocess_env)
from transforms.shard import pack, records, shard_shuffle
from transforms.shard.spill import INDEX_DTYPE

pytestmark = pytest.mark.timeout(300)
NUM_SHARDS = 64  # more train shards than ~80 documents fill: some are empty (asserted below)
HELD_OUT_REPEATS = 7  # train documents the --val-input repeats
WEIGHTS = "Docs=2,Pile-CC=0.5"  # train copies repeated and dropped (transforms/shard/mixture.py) on both paths


@pytest.mark.parametrize("runner,expected", [
    ("DataflowRunner", "runner"), ("apache_beam.runners.dataflow.dataflow_runner.DataflowRunner", "runner"),
    ("TestDataflowRunner", "runner"), ("FlinkRunner", "runner"), ("SparkRunner", "runner"),
    ("FnApiRunner", "files"), ("SwitchingDirectRunner", "files"), ("DirectRunner", "files"),
    ("PrismRunner", "files"), ("BundleBasedDirectRunner", "files"), ("PortableRunner", "runner"),
    ("DaskRunner", "runner"), (runners.DASK_RUNNER, "runner"), ("", "files")])
def test_auto_resolves_per_runner(runner, expected):
    assert runners.choose_shuffle("auto", runner) == expected
    assert runners.choose_shuffle("files", runner) == "files"
    assert runners.choose_shuffle("runner", runner) == "runner"


def test_every_cluster_example_in_the_readme_gets_the_runner_shuffle():
    """The README's Dataflow / Flink / Spark / Dask commands, parsed as the CLI parses them: each one's shuffle
    (explicit or auto) is the runner's own, never the file spill's one read per unit and shard."""
    from pipeline import cli, options
    from tests.e2e.test_cli import REQUIRED, readme_flag_sets

    sets = readme_flag_sets()
    assert {"Apache Flink", "Apache Spark", "A Dask"} <= set(sets), sets.keys()
    for title, words in sets.items():
        if "--runner=DataflowRunner" in words:
            assert runners.choose_shuffle("auto", "DataflowRunner") == "runner"
            continue  # parsing it needs the gcp extra (tests/e2e/test_cli.py)
        args, beam_args = cli.parse([a for a in words[1:] if a != "..."] + REQUIRED)
        assert runners.choose_shuffle(args.shuffle, options.runner_name(beam_args)) == "runner", title


def test_bad_shuffle_choice_fails_fast():
    with pytest.raises(ConfigError, match="--shuffle"):
        ShardConfig(inputs=("a",), output="o", tokenizer="t", shuffle="spark").validate()


def test_shuffle_is_not_part_of_the_dataset_identity():
    base = dict(inputs=("a",), output="o", tokenizer="t")
    assert ShardConfig(**base, shuffle="runner").to_manifest_dict() == ShardConfig(**base).to_manifest_dict()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
    """Train files plus a --val-input that repeats some train documents (cross-split dedup drops the train copies)."""
    root = tmp_path_factory.mktemp("shuffle-corpus")
    docs = write_good_corpus(root / "train", limit_bytes=300_000, files=2)
    fresh = good_documents(80_000, skip=60)
    write_zst(root / "val.jsonl.zst", [pile_line(t, s) for t, s in docs[1:1 + HELD_OUT_REPEATS] + fresh])
    return root


def _build(corpus: pathlib.Path, out: pathlib.Path, tokenizer: str, shuffle: str, beam_args=FAST_LOCAL) -> list:
    config = ShardConfig(inputs=(str(corpus / "train" / "*"),), val_inputs=(str(corpus / "val.jsonl.zst"),),
                         output=str(out), tokenizer=tokenizer, seq_len=128, num_shards=NUM_SHARDS, unit_mb=0.05,
                         source_weights=WEIGHTS, shuffle=shuffle)
    shard_pipeline.run(config, beam_args, run_log=str(out.parent / (out.name + ".log")), progress_every_s=0)
    return [e["shuffle"] for e in runlog.read_run_log(str(out.parent / (out.name + ".log")))
            if e["event"] == "shuffle"]


@pytest.fixture(scope="module")
def built(corpus, tiny_tokenizer, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("shuffle-out")
    ran = {shuffle: _build(corpus, root / shuffle, tiny_tokenizer, shuffle) for shuffle in ("files", "runner")}
    ran["auto"] = _build(corpus, root / "auto", tiny_tokenizer, "auto")
    return {"root": root, "ran": ran}


def test_runner_shuffle_writes_the_same_bytes_as_the_file_spill(built):
    root = built["root"]
    assert built["ran"] == {"files": ["files"], "runner": ["runner"], "auto": ["files"]}  # FnApiRunner: auto=files
    files, runner = dataset_files(root / "files"), dataset_files(root / "runner")
    assert files.keys() == runner.keys()
    assert [k for k in files if files[k] != runner[k]] == []  # shards, id index, manifest: every byte


def test_the_comparison_covers_dedup_and_empty_shards(built):
    """The fixture's premises: cross-split duplicates were dropped, and some planned shards hold nothing."""
    import json

    manifest = json.loads(dataset_files(built["root"] / "runner")["manifest.json"])
    train = [s for s in manifest["shards"] if s["split"] == "train"]
    assert len(train) == NUM_SHARDS
    assert any(s["examples"] == 0 for s in train) and any(s["examples"] > 0 for s in train)
    assert "val" in {s["split"] for s in manifest["shards"]}
    # the val repeats lose their train copies (cross-split dedup), plus write_good_corpus's dup.jsonl copy
    assert manifest["records"]["filtered"]["duplicate"] == HELD_OUT_REPEATS + 1


@pytest.fixture(scope="module")
def portable_checkout_services(tmp_path_factory):
    """Beam's job service and an EXTERNAL worker pool whose workers import this checkout (PYTHONPATH), as a
    cluster's workers import it from their image; killed at teardown."""
    with start_portable_services(tmp_path_factory.mktemp("portable-shuffle"),
                                 subprocess_env(PYTHONPATH=str(REPO))) as services:
        yield portable_args(services), services["logs"][1]


def test_runner_shuffle_on_the_portable_runner_writes_the_same_bytes(built, corpus, tiny_tokenizer, tmp_path,
                                                                    portable_checkout_services):
    """The pieces cross process boundaries through the job service's GroupByKey (Beam's coders)."""
    beam_args, pool_log = portable_checkout_services
    out = tmp_path / "portable"
    res = run_cli(["shard", "--input", str(corpus / "train" / "*"), "--val-input", str(corpus / "val.jsonl.zst"),
                   "--output", str(out), "--tokenizer", tiny_tokenizer, "--seq-len", "128", "--num-shards",
                   str(NUM_SHARDS), "--unit-mb", "0.05", "--source-weights", WEIGHTS, "--shuffle", "runner",
                   "--progress-every", "0", *beam_args], timeout_s=150)
    assert res.returncode == 0, res.stderr[-3000:] + "\n" + pool_log.read_text()[-2000:]
    reference, got = dataset_files(built["root"] / "files"), dataset_files(out)
    assert got.keys() == reference.keys()
    assert [k for k in got if got[k] != reference[k]] == []


# ------------------------------------------------------------------------------------------ pure parts
def _unit(tmp_path: pathlib.Path, name: str, n: int, seed: int):
    """A unit's spill files as the tokenize stage writes them: index sorted by key, tokens in index order."""
    rng = np.random.default_rng(seed)
    index = np.zeros(n, dtype=INDEX_DTYPE)
    index["key"] = np.sort(rng.integers(0, 1 << 62, size=n, dtype=np.uint64))
    index["doc_id"] = rng.integers(0, 1 << 63, size=n, dtype=np.uint64)
    index["line"] = np.arange(n)
    index["file_idx"] = seed
    index["n_tokens"] = rng.integers(0, 40, size=n)
    index["token_start"] = np.concatenate(([0], np.cumsum(index["n_tokens"].astype(np.int64))[:-1]))
    tokens = rng.integers(0, 1000, size=int(index["n_tokens"].sum()), dtype=np.uint16)
    (tmp_path / (name + ".index")).write_bytes(index.tobytes())
    (tmp_path / (name + ".tokens")).write_bytes(tokens.tobytes())
    return records.UnitResult(name, seed, f"in-{seed}.jsonl", str(tmp_path / (name + ".index")),
                             str(tmp_path / (name + ".tokens")), n, "<u2", ["s"], [0, 0, 0], {}, None)


def test_pieces_merge_to_the_file_spill_rows_in_any_order(tmp_path):
    units = [_unit(tmp_path, f"u{i}", n, i) for i, n in enumerate((300, 0, 1, 57))]
    plan = shard_shuffle.ShardPlan((7, 0, 0))
    grouped: dict = {}
    for key, marker in shard_shuffle.markers(plan):
        grouped.setdefault(key, []).append(marker)
    for unit in units:
        if unit.n_docs:
            index, tokens = shard_shuffle.read_unit(unit)
            for key, piece in shard_shuffle.cut_unit(unit, index, tokens, plan):
                grouped[key].append(piece)
    assert sorted(grouped) == [(0, s) for s in range(7)]
    for key, values in grouped.items():
        random.Random(key[1]).shuffle(values)  # a shuffle delivers values in any order
        task, _dedup, pieces, (rows, which, buffers) = shard_shuffle.gather_pieces(key, values)
        ref_rows, ref_which, ref_buffers = pack._gather_shard_documents(task, units)  # noqa: SLF001
        assert rows.tobytes() == ref_rows.tobytes()
        got = [buffers[b][2][r["token_start"] - buffers[b][1]:][:r["n_tokens"]].tolist() for r, b in zip(rows, which)]
        ref = [ref_buffers[b][2][r["token_start"] - ref_buffers[b][1]:][:r["n_tokens"]].tolist()
               for r, b in zip(ref_rows, ref_which)]
        assert got == ref
        assert [pieces[b].input_path for b in which] == [units[ref_buffers[b][0]].input_path for b in ref_which]


def test_a_piece_without_a_planned_shard_fails(tmp_path):
    unit = _unit(tmp_path, "u", 50, 1)
    index, tokens = shard_shuffle.read_unit(unit)
    key, piece = next(shard_shuffle.cut_unit(unit, index, tokens, shard_shuffle.ShardPlan((2, 0, 0))))
    with pytest.raises(ValueError, match="never planned"):
        shard_shuffle.gather_pieces(key, [piece])
