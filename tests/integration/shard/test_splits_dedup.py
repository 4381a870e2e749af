"""Splits that respect the corpus, and one document identity (docs/DESIGN.md).

--val-input / --test-input files go wholly to their split; the id is a hash of the text alone, so the same
text under two sources is one document; held-out copies win over train; removed copies are counted per source;
incremental runs deduplicate against every committed generation (five incremental runs == one full build).
"""
from __future__ import annotations

import collections
import logging
import pathlib

import numpy as np
import pytest

from model_contract import decode_example, read_records
from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from tests.corpus_fixtures import good_documents, pile_line, write_zst
from transforms.shard import doc_ids
from transforms.shard.documents import HASHED, assign_split, document_id, looks_like_held_out

pytestmark = pytest.mark.timeout(300)
FAST = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
TWO_PROCESSES = ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]


def run(out: pathlib.Path, tokenizer: str, inputs, beam_args=FAST, incremental=False, **kw) -> dict:
    config = ShardConfig(inputs=tuple(str(i) for i in inputs), output=str(out), tokenizer=tokenizer, seq_len=128,
                         num_shards=2, unit_mb=0.05, **kw)
    return shard_pipeline.run(config, beam_args, incremental_run=incremental, progress_every_s=0)


def documents_by_split(out: pathlib.Path, manifest: dict) -> dict:
    """doc id -> list of splits of every copy whose first piece is in the shards."""
    where = collections.defaultdict(list)
    for s in manifest["shards"]:
        for record in read_records(str(out / s["path"])):
            ex = decode_example(record)
            for doc, off in zip(ex["piece_doc_ids"], ex["piece_offsets"]):
                if off == 0:
                    where[int(doc)].append(s["split"])
    return where


# --------------------------------------------------------------------------------------------- pure parts
def test_document_id_is_the_text_alone():
    assert document_id("same text") == document_id("same text")
    assert document_id("same text") != document_id("same text!")


def test_held_out_inputs_keep_their_split_and_train_inputs_hash():
    ids = [document_id(str(i)) for i in range(2000)]
    assert {assign_split(i, 1, 0.5, 0.5) for i in ids} == {1}
    assert {assign_split(i, 2, 0.0, 0.0) for i in ids} == {2}
    assert {assign_split(i, HASHED, 0.0, 0.0) for i in ids} == {0}
    assert len({assign_split(i, HASHED, 0.3, 0.3) for i in ids}) == 3


@pytest.mark.parametrize("name,held_out", [("val.jsonl.zst", True), ("pile/valid_00.jsonl", True),
                                           ("s3://b/test.jsonl.zst", True), ("validation-1.json.gz", True),
                                           ("00.jsonl.zst", False), ("latest.jsonl", False),
                                           ("contest/a.jsonl", False)])
def test_held_out_file_names_are_recognised(name, held_out):
    assert looks_like_held_out(name) is held_out


def test_config_fractions_default_to_zero_with_held_out_files():
    base = dict(inputs=("a",), output="o", tokenizer="t")
    assert (ShardConfig(**base).val_fraction, ShardConfig(**base).test_fraction) == (0.01, 0.01)
    held = ShardConfig(**base, val_inputs=("v",))
    assert (held.val_fraction, held.test_fraction) == (0.0, 0.0)
    assert ShardConfig(**base, test_inputs=("t",), val_fraction=0.2).val_fraction == 0.2


def read_index_ids(path: str):
    """Every id of an index, in sorted batches: read straight after its header, past IdIndex's fence lookups."""
    index = doc_ids.IdIndex(path)
    with open(path, "rb") as f:
        f.seek(index._ids_at)  # noqa: SLF001
        left = index.n
        while left:
            data = f.read(min(left, doc_ids.MERGE_BLOCK) * doc_ids.ID_DTYPE.itemsize)
            if not data:
                raise IOError(f"{path}: document id index cut short")
            batch = np.frombuffer(data, dtype=doc_ids.ID_DTYPE)
            left -= batch.size
            yield batch


def test_id_index_lookup_and_merge(tmp_path):
    rng = np.random.default_rng(3)
    ids = np.unique(rng.integers(0, 2 ** 63, size=20_000, dtype=np.uint64))
    parts = []
    for i, part in enumerate(np.array_split(rng.permutation(ids), 4)):
        parts.append(str(tmp_path / f"{i}.ids"))
        with open(parts[-1], "wb") as f:
            doc_ids.write_sorted_ids(f, part)
    n, _size, _sha = doc_ids.write_index(str(tmp_path / "idx"), doc_ids.merge_sorted_files(parts, block=777),
                                         ids.size, fence_every=64)
    assert n == ids.size
    assert np.array_equal(np.concatenate(list(read_index_ids(str(tmp_path / "idx")))), ids)
    others = rng.integers(0, 2 ** 63, size=5000, dtype=np.uint64)
    others = others[~np.isin(others, ids)]
    query = np.concatenate([ids[::7], others, ids[:1], ids[-1:]])
    hit = doc_ids.IdIndex(str(tmp_path / "idx")).contains(query)
    assert hit.tolist() == np.isin(query, ids).tolist()


# ------------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def held_out_corpus(tmp_path_factory):
    """Pile layout: train/ files, val and test files; some texts repeated across files, sources and splits."""
    root = tmp_path_factory.mktemp("pile")
    docs = good_documents(500_000, doc_chars=1500)
    val_docs, test_docs, train_docs = docs[:20], docs[20:40], docs[40:]
    (root / "train").mkdir()
    # the same text as a val document, under another source, in a train file: val wins
    cross = [(val_docs[0][0], "OtherSource"), (test_docs[0][0], "Docs"), (test_docs[1][0], "Pile-CC")]
    # the same text twice in train under two sources: one document
    twice = [(train_docs[0][0], "SourceB")]
    write_zst(root / "train" / "00.jsonl.zst", [pile_line(t, s) for t, s in train_docs[::2] + cross])
    write_zst(root / "train" / "01.jsonl.zst", [pile_line(t, s) for t, s in train_docs[1::2] + twice])
    write_zst(root / "val.jsonl.zst", [pile_line(t, s) for t, s in val_docs])
    # a val document also in test: test wins (no text in two splits)
    write_zst(root / "test.jsonl.zst", [pile_line(t, s) for t, s in test_docs + [val_docs[1]]])
    return root, train_docs, val_docs, test_docs


@pytest.fixture(scope="module")
def held_out_dataset(held_out_corpus, tiny_tokenizer, tmp_path_factory):
    root = held_out_corpus[0]
    out = tmp_path_factory.mktemp("out") / "ds"
    manifest = run(out, tiny_tokenizer, [root / "train" / "*.jsonl.zst"], val_inputs=(str(root / "val.jsonl.zst"),),
                   test_inputs=(str(root / "test.jsonl.zst"),))
    return out, manifest


def test_held_out_files_go_wholly_to_their_split(held_out_corpus, held_out_dataset):
    _root, train_docs, val_docs, test_docs = held_out_corpus
    out, manifest = held_out_dataset
    where = documents_by_split(out, manifest)
    assert all(where[document_id(t)] == ["test"] for t, _ in test_docs)
    assert where[document_id(val_docs[1][0])] == ["test"]  # in both held-out files: test wins
    assert all(where[document_id(t)] == ["val"] for t, _ in val_docs[:1] + val_docs[2:])
    assert all(where[document_id(t)] == ["train"] for t, _ in train_docs)  # fractions default to 0
    assert manifest["config"]["val_fraction"] == 0.0 and manifest["config"]["test_fraction"] == 0.0


def test_each_text_is_written_once_and_removed_copies_are_counted_by_source(held_out_corpus, held_out_dataset):
    _root, train_docs, val_docs, test_docs = held_out_corpus
    out, manifest = held_out_dataset
    where = documents_by_split(out, manifest)
    assert all(len(splits) == 1 for splits in where.values())
    assert len(where) == len(train_docs) + len(val_docs) + len(test_docs)
    # removed: val_docs[0] (OtherSource, train file), test_docs[0] (Docs), test_docs[1] (Pile-CC), train_docs[0]
    # or its SourceB copy (whichever sorts second), val_docs[1] (val file, its source)
    removed = manifest["duplicates_by_source"]
    assert sum(removed.values()) == 5 == manifest["records"]["filtered"]["duplicate"]
    assert removed["OtherSource"] == 1
    # the kept copy's source is the one counted: val_docs[0] is counted under its val source
    assert manifest["records"]["written"] == len(where)


def test_train_input_named_like_a_held_out_file_is_warned_about(held_out_corpus, tiny_tokenizer, tmp_path, caplog):
    root = held_out_corpus[0]
    with caplog.at_level(logging.WARNING, logger="pileprep.splits"):
        shard_pipeline.prepare(ShardConfig(inputs=(str(root / "*.jsonl.zst"),), output=str(tmp_path / "o"),
                                           tokenizer=tiny_tokenizer))
    warned = [r.getMessage() for r in caplog.records]
    assert any("val.jsonl.zst" in w and "--val-input" in w for w in warned)
    assert any("test.jsonl.zst" in w for w in warned)


def test_a_file_claimed_by_two_flags_is_refused(held_out_corpus, tiny_tokenizer, tmp_path):
    from pipeline.errors import ConfigError

    root = held_out_corpus[0]
    with pytest.raises(ConfigError, match="--val-input"):
        shard_pipeline.prepare(ShardConfig(inputs=(str(root / "*.jsonl.zst"),), output=str(tmp_path / "o"),
                                           tokenizer=tiny_tokenizer, val_inputs=(str(root / "val.jsonl.zst"),)))


def test_dedup_is_byte_identical_across_worker_counts(held_out_corpus, held_out_dataset, tiny_tokenizer, tmp_path):
    root = held_out_corpus[0]
    out, _ = held_out_dataset
    other = tmp_path / "ds"
    run(other, tiny_tokenizer, [root / "train" / "*.jsonl.zst"], beam_args=TWO_PROCESSES,
        val_inputs=(str(root / "val.jsonl.zst"),), test_inputs=(str(root / "test.jsonl.zst"),))
    assert (other / "manifest.json").read_bytes() == (out / "manifest.json").read_bytes()
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(other) for p in other.rglob("*") if p.is_file())
    assert all((out / f).read_bytes() == (other / f).read_bytes() for f in files)


def test_five_incremental_runs_hold_the_documents_of_one_full_build(tiny_tokenizer, tmp_path):
    docs = good_documents(150_000, doc_chars=1200)
    # repeats inside and across parts, under other sources: the cases that went in twice before
    lines = [pile_line(t, s) for t, s in docs] + [pile_line(t, "Again") for t, _ in docs[::9]]
    order = np.random.default_rng(0).permutation(len(lines))
    lines = [lines[i] for i in order]
    full_dir, inbox = tmp_path / "full", tmp_path / "inbox"
    full_dir.mkdir()
    inbox.mkdir()
    parts = np.array_split(np.arange(len(lines)), 5)
    for i, idx in enumerate(parts):
        write_zst(full_dir / f"part{i}.jsonl.zst", [lines[j] for j in idx])
    full = run(tmp_path / "full_out", tiny_tokenizer, [full_dir / "*"], val_fraction=0.1, test_fraction=0.1)
    for i in range(5):
        (inbox / f"part{i}.jsonl.zst").write_bytes((full_dir / f"part{i}.jsonl.zst").read_bytes())
        inc = run(tmp_path / "inc_out", tiny_tokenizer, [inbox / "*"], incremental=True, val_fraction=0.1,
                  test_fraction=0.1)
    assert len(inc["generations"]) == 5
    full_docs = documents_by_split(tmp_path / "full_out", full)
    inc_docs = documents_by_split(tmp_path / "inc_out", inc)
    assert all(len(s) == 1 for s in inc_docs.values()), "a document was written twice"
    assert inc_docs == full_docs
    assert len(full_docs) == len({t for t, _ in docs})
    assert inc["records"]["filtered"]["duplicate"] == full["records"]["filtered"]["duplicate"]
    assert inc["duplicates_by_source"] == full["duplicates_by_source"]
