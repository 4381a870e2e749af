"""The sample corpus: Pile format, both sources in every train file, >= 20 MB, byte-identical across runs;
`--size-mb` past the installation's text fills with marked copies (distinct documents), deterministically."""
import json
import os

import pytest
import zstandard

from pipeline import cli
from pipeline.tools import sample_corpus
from pipeline.tools.sample_corpus import NUM_TRAIN_FILES, PACKAGE_DOCS, STDLIB_CODE, write_sample_corpus
from transforms.shard.documents import document_id

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


# ------------------------------------------------------------------ --size-mb and the fill with marked copies
def _tiny_tree(root, n_docs=3, n_code=4):
    """A fake installation: a few small doc and code files (the two main sources fall far short)."""
    for i in range(n_docs):
        (root / "docs").mkdir(parents=True, exist_ok=True)
        (root / "docs" / f"README{i}.md").write_text(f"# package {i}\n\nSome text about package {i}.\n" * 5)
    for i in range(n_code):
        (root / "lib").mkdir(parents=True, exist_ok=True)
        (root / "lib" / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}  # \"quoted\" é\n" * 8)


@pytest.fixture()
def tiny_install(tmp_path, monkeypatch):
    root = tmp_path / "install"
    _tiny_tree(root)
    monkeypatch.setattr(sample_corpus, "package_doc_candidates",
                        lambda: sample_corpus._walk(str(root / "docs"), lambda rel, name: True))  # noqa: SLF001
    monkeypatch.setattr(sample_corpus, "stdlib_code_candidates",
                        lambda: sample_corpus._walk(str(root / "lib"), lambda rel, name: True))  # noqa: SLF001
    monkeypatch.setattr(sample_corpus, "package_code_candidates", lambda: [])
    return root


def _all_records(root):
    out = []
    for rel in EXPECTED_FILES:  # a tiny target may leave a train file empty
        with open(os.path.join(root, rel), "rb") as f:
            out += [json.loads(x) for x in zstandard.ZstdDecompressor().stream_reader(f).read().splitlines()]
    return out


def test_past_the_installation_marked_copies_fill_the_target(tiny_install, tmp_path):
    target_mb = 0.05  # ~25x the tiny installation's text
    summary = write_sample_corpus(str(tmp_path / "a"), target_mb=target_mb)
    records = _all_records(str(tmp_path / "a"))
    originals = {(r["meta"]["pile_set_name"], r["meta"]["path"]): r["text"] for r in records
                 if "copy" not in r["meta"]}
    copies = [r for r in records if "copy" in r["meta"]]
    assert len(originals) == 7 and summary["copies"] == len(copies) > 7 * 10
    assert summary["uncompressed_bytes"] >= target_mb * 1e6
    assert summary["uncompressed_bytes"] < target_mb * 1e6 + max(map(len, originals.values())) + 200
    texts = [r["text"] for r in records]
    assert len(set(texts)) == len(texts)  # every copy is a distinct document: exact dedup keeps it
    assert len({document_id(t) for t in texts}) == len(texts)
    for r in copies:
        k = r["meta"]["copy"]
        original = originals[(r["meta"]["pile_set_name"], r["meta"]["path"])]
        assert k >= 1 and r["text"] == original + sample_corpus.COPY_MARKER.format(k=k)
    # copies keep the mix: each train file still holds both sources
    for i in range(NUM_TRAIN_FILES):
        lines, _ = _lines(os.path.join(tmp_path / "a", f"train/{i:02d}.jsonl.zst"))
        assert {json.loads(x)["meta"]["pile_set_name"] for x in lines} == {STDLIB_CODE, PACKAGE_DOCS}
    # deterministic: the same installation writes the same bytes
    again = write_sample_corpus(str(tmp_path / "b"), target_mb=target_mb)
    assert {k: v for k, v in summary.items() if k != "output_dir"} == {
        k: v for k, v in again.items() if k != "output_dir"}
    assert _tree_bytes(str(tmp_path / "a")) == _tree_bytes(str(tmp_path / "b"))


def test_no_copies_while_the_installation_has_text(tiny_install, tmp_path):
    summary = write_sample_corpus(str(tmp_path), target_mb=0.001)
    assert summary["copies"] == 0
    assert not [r for r in _all_records(str(tmp_path)) if "copy" in r["meta"]]


def test_an_installation_without_text_is_an_error_not_a_loop(tmp_path, monkeypatch):
    for name in ("package_doc_candidates", "stdlib_code_candidates", "package_code_candidates"):
        monkeypatch.setattr(sample_corpus, name, lambda: [])
    with pytest.raises(ValueError, match="no text"):
        write_sample_corpus(str(tmp_path), target_mb=0.01)


def test_cli_size_mb_writes_that_much_and_the_same_bytes_twice(tmp_path, capsys):
    for name in ("a", "b"):
        assert cli.main(["sample", "--output", str(tmp_path / name), "--size-mb", "1.5"]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert 1_500_000 <= summary["uncompressed_bytes"] < 3_000_000
    assert _tree_bytes(str(tmp_path / "a")) == _tree_bytes(str(tmp_path / "b"))


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf", "lots"])
def test_cli_bad_size_is_one_line_exit_2(tmp_path, capsys, bad):
    assert cli.main(["sample", "--output", str(tmp_path / "x"), f"--size-mb={bad}"]) == 2
    err = capsys.readouterr().err
    assert "--size-mb" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x").exists()
