"""pipeline/shard/graph.py: each composite transform of the shard graph on a small corpus, run on Beam's
TestPipeline and checked with assert_that against the pure stage functions of transforms/shard/ called directly
(the same chunks, units and shard bytes whichever way the graph goes)."""
from __future__ import annotations

import pathlib

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from pipeline.config import ShardConfig
from pipeline.shard import graph, shard_pipeline
from tests.corpus_fixtures import good_documents, pile_line, write_zst
from transforms.io import io_utils
from transforms.shard import cut, pack, tokenize_unit

FILES = 3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("graph-corpus")
    docs = good_documents(360_000, doc_chars=1500)
    per = len(docs) // FILES
    for i in range(FILES):
        write_zst(root / f"part-{i}.jsonl.zst", [pile_line(t, s) for t, s in docs[i * per:(i + 1) * per]])
    return root


def _plan(corpus, tiny_tokenizer, out):
    config = ShardConfig(inputs=(str(corpus / "*"),), output=str(out), tokenizer=tiny_tokenizer, seq_len=64,
                         unit_mb=0.04, val_fraction=0.1, test_fraction=0.1)
    return shard_pipeline.prepare(config)


def _files(plan) -> list:
    return [(i, e.path, None) for i, e in enumerate(plan.ledger)]


def _direct_units(plan) -> list:
    """The units the pure functions give: each file cut in memory and tokenized (transforms/shard/)."""
    cfg = plan.config
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=plan.model_bytes)
    settings = tokenize_unit.TokenizeSettings(cfg.text_field, tuple(cfg.source_fields), cfg.val_fraction,
                                              cfg.test_fraction, cfg.seed, plan.input_splits)
    units = []
    for file_idx, path, _ in _files(plan):
        cutter = cut.InputCutter(file_idx, path, cfg.unit_bytes, cfg.max_line_bytes)
        units += [tokenize_unit.tokenize_records(ref, records, sp, np.dtype("<u2"), settings, plan.staging_dir,
                                                 plan.data_dir) for ref, records in cutter.chunks()]
    return units


@pytest.mark.parametrize("spread_chunks", [True, False], ids=["spread", "fused"])
def test_cut_and_tokenize_gives_the_units_of_the_pure_stage_functions(corpus, tiny_tokenizer, tmp_path,
                                                                     spread_chunks):
    plan = _plan(corpus, tiny_tokenizer, tmp_path / "out")
    want = _direct_units(_plan(corpus, tiny_tokenizer, tmp_path / "direct"))
    assert len(want) > FILES  # several chunks per file
    with test_pipeline.TestPipeline() as p:
        cuts, units = p | beam.Create(_files(plan)) | graph.CutAndTokenize(plan, spread_chunks)
        assert_that(cuts | "FileIdx" >> beam.Map(lambda c: (c.result.file_idx, len(c.result.chunks))),
                    equal_to([(i, sum(u.file_idx == i for u in want)) for i in range(FILES)]), label="Cuts")
        assert_that(units | "Unit" >> beam.Map(lambda u: (u.name, u.n_docs, tuple(u.split_tokens))),
                    equal_to([(u.name, u.n_docs, tuple(u.split_tokens)) for u in want]), label="Units")
    for u in want:  # and the same bytes
        mine = io_utils.join(plan.staging_dir, "units", u.name + ".tokens")
        assert pathlib.Path(mine).read_bytes() == pathlib.Path(u.tokens_path).read_bytes()


@pytest.mark.parametrize("shuffle", ["files", "runner"])
def test_pack_shards_gives_the_shards_pack_shard_writes(corpus, tiny_tokenizer, tmp_path, shuffle):
    plan = _plan(corpus, tiny_tokenizer, tmp_path / "out")
    units = _direct_units(plan)
    _units, tasks, dedup = graph._units_tasks_dedup(units, plan)  # noqa: SLF001 - the plan both shuffles share
    t = plan.contract.tokenizer
    direct_dir = tmp_path / "direct-shards"
    want = [pack.pack_shard(task, _units, plan.config.seq_len, t.eos_id, t.pad_id, str(direct_dir), dedup)
            for task in tasks]
    assert len(want) >= 3  # train, val, test at least
    with test_pipeline.TestPipeline() as p:
        shards = p | beam.Create(units) | graph.PackShards(plan, shuffle)
        assert_that(shards | beam.Map(lambda s: (s.task.file_name, s.sha256, s.examples, s.documents)),
                    equal_to([(s.task.file_name, s.sha256, s.examples, s.documents) for s in want]))


def test_build_shards_commits_a_manifest_whose_counts_reconcile(corpus, tiny_tokenizer, tmp_path):
    plan = _plan(corpus, tiny_tokenizer, tmp_path / "out")
    lines = sum(1 for i in range(FILES) for _ in _lines(corpus / f"part-{i}.jsonl.zst"))
    with test_pipeline.TestPipeline() as p:
        manifest = p | graph.BuildShards(plan, spread_chunks=True, shuffle="files")
        assert_that(manifest | beam.Map(lambda m: (m["records"]["read"], m["generation"], m["kind"])),
                    equal_to([(lines, plan.generation, "dataset")]))
    assert (tmp_path / "out" / "manifest.json").exists()


def _lines(path: pathlib.Path):
    import zstandard

    yield from zstandard.ZstdDecompressor().decompress(path.read_bytes(), max_output_size=1 << 30).splitlines()
