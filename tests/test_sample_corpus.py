"""The sample corpus: Pile format, both sources in every train file, >= 20 MB, byte-identical across runs."""
import json
import os

import pytest
import zstandard

from pipeline.tools.sample_corpus import NUM_TRAIN_FILES, PACKAGE_DOCS, STDLIB_CODE, write_sample_corpus

EXPECTED_FILES = [f"train/{i:02d}.jsonl.zst" for i in range(NUM_TRAIN_FILES)] + ["val.jsonl.zst",
                                                                                  "test.jsonl.zst"]


def _lines(path):
    with open(path, "rb") as f:
        data = zstandard.ZstdDecompressor().stream_reader(f).read()
    assert data.endswith(b"\n")
    return data.split(b"\n")[:-1], len(data)


def _tree_bytes(root):
    return {rel: open(os.path.join(root, rel), "rb").read() for rel in EXPECTED_FILES}


@pytest.fixture(scope="session")
def full_corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("sample-full")
    return str(out), write_sample_corpus(str(out))


def test_default_corpus_is_at_least_20mb_and_pile_formatted(full_corpus):
    out, summary = full_corpus
    assert sorted(summary["files"]) == sorted(EXPECTED_FILES)
    total, by_source = 0, {}
    for rel in EXPECTED_FILES:
        lines, size = _lines(os.path.join(out, rel))
        total += size
        assert lines, rel
        for line in lines:
            record = json.loads(line)
            assert isinstance(record["text"], str) and record["text"].strip()
            source = record["meta"]["pile_set_name"]
            path = record["meta"]["path"]
            assert not os.path.isabs(path) and ".." not in path.split("/")
            by_source[source] = by_source.get(source, 0) + 1
    assert total >= 20_000_000
    assert total == summary["uncompressed_bytes"]
    assert by_source == summary["documents"]
    assert by_source[STDLIB_CODE] > 0 and by_source[PACKAGE_DOCS] > 0
    assert not [n for n in os.listdir(out) if ".tmp" in n]


def test_every_train_file_mixes_both_sources(full_corpus):
    out, _ = full_corpus
    for i in range(NUM_TRAIN_FILES):
        lines, _ = _lines(os.path.join(out, f"train/{i:02d}.jsonl.zst"))
        sources = {json.loads(line)["meta"]["pile_set_name"] for line in lines}
        assert {STDLIB_CODE, PACKAGE_DOCS} <= sources, i


def test_holdout_files_are_small(full_corpus):
    _, summary = full_corpus
    splits = summary["documents_by_split"]
    n = sum(splits.values())
    for name in ("val", "test"):
        assert 0 < splits[name] <= 0.03 * n


def test_bytes_identical_across_runs(tmp_path):
    a = write_sample_corpus(str(tmp_path / "a"), target_mb=2)
    b = write_sample_corpus(str(tmp_path / "b"), target_mb=2)
    assert {k: v for k, v in a.items() if k != "output_dir"} == {k: v for k, v in b.items() if k != "output_dir"}
    assert _tree_bytes(str(tmp_path / "a")) == _tree_bytes(str(tmp_path / "b"))


def test_small_target_is_bounded_and_mixed(tmp_path):
    summary = write_sample_corpus(str(tmp_path), target_mb=2)
    assert 2_000_000 <= summary["uncompressed_bytes"] < 4_000_000
    for i in range(NUM_TRAIN_FILES):
        lines, _ = _lines(os.path.join(tmp_path, f"train/{i:02d}.jsonl.zst"))
        assert {json.loads(x)["meta"]["pile_set_name"] for x in lines} >= {STDLIB_CODE, PACKAGE_DOCS}


def test_rewrite_replaces_files(tmp_path):
    write_sample_corpus(str(tmp_path), target_mb=1)
    first = _tree_bytes(str(tmp_path))
    write_sample_corpus(str(tmp_path), target_mb=1)
    assert _tree_bytes(str(tmp_path)) == first


def test_bad_target(tmp_path):
    with pytest.raises(ValueError, match="target_mb"):
        write_sample_corpus(str(tmp_path), target_mb=0)
