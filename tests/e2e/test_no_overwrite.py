"""Commands that write files replace only what they created (pipeline/tools/sample_corpus.py,
pipeline/tools/tokenizer_train.py): `pileprep sample --output DIR` refuses files in DIR an earlier sample did not
write, `pileprep tokenizer train` refuses an existing output (the `.tiktoken` beside an hf-bpe `--output x.json`
too) and never writes over one of its inputs; `--overwrite` allows the replacement. Exit 2, one line, nothing
written."""
from __future__ import annotations

import os

import pytest

from pipeline import cli
from pipeline.tools import sample_corpus
from pipeline.tools.tokenizer_train import train
from tests.corpus_fixtures import good_documents, pile_line, write_zst

SIZE = ["--size-mb", "0.3"]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_sample_refuses_files_it_did_not_write_and_replaces_its_own(tmp_path, capsys):
    out = tmp_path / "corpus"
    out.mkdir()
    (out / "val.jsonl.zst").write_bytes(b"the real validation set")
    assert cli.main(["sample", "--output", str(out), *SIZE]) == 2
    line = _one_line(capsys)
    assert "val.jsonl.zst" in line and "--overwrite" in line
    assert sorted(os.listdir(out)) == ["val.jsonl.zst"] and (out / "val.jsonl.zst").read_bytes() == \
        b"the real validation set"

    assert cli.main(["sample", "--output", str(out), *SIZE, "--overwrite"]) == 0
    capsys.readouterr()
    first = {p: (out / p).read_bytes() for p in sample_corpus.output_names()}
    assert cli.main(["sample", "--output", str(out), *SIZE]) == 0  # its own files, unchanged: replaced
    capsys.readouterr()
    assert {p: (out / p).read_bytes() for p in sample_corpus.output_names()} == first

    (out / "test.jsonl.zst").write_bytes(b"edited since")  # changed since the sample wrote it: no longer its own
    assert cli.main(["sample", "--output", str(out), *SIZE]) == 2
    assert "test.jsonl.zst" in _one_line(capsys)
    assert (out / "test.jsonl.zst").read_bytes() == b"edited since"


def test_sample_never_writes_through_a_link_in_its_output(tmp_path, capsys):
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "corpus"
    elsewhere.mkdir()
    out.mkdir()
    os.symlink(elsewhere, out / "train")
    assert cli.main(["sample", "--output", str(out), *SIZE, "--overwrite"]) == 2
    assert "symbolic link" in _one_line(capsys) and os.listdir(elsewhere) == []


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok-inputs")
    write_zst(root / "a.jsonl.zst", [pile_line(t, s) for t, s in good_documents(80_000)])
    return root


def test_hf_bpe_refuses_an_existing_tiktoken_beside_its_output_unless_overwrite(inputs, tmp_path, capsys):
    out = tmp_path / "tok.json"
    (tmp_path / "tok.tiktoken").write_bytes(b"someone's tiktoken file")
    args = ["tokenizer", "train", "--kind", "hf-bpe", "--input", str(inputs / "*"), "--output", str(out),
            "--vocab-size", "300"]
    assert cli.main(args) == 2
    line = _one_line(capsys)
    assert "tok.tiktoken" in line and "--overwrite" in line
    assert not out.exists() and (tmp_path / "tok.tiktoken").read_bytes() == b"someone's tiktoken file"
    summary = train("hf-bpe", [str(inputs / "*")], str(out), 300, overwrite=True, max_sentences=200)
    assert out.is_file() and (tmp_path / "tok.tiktoken").read_bytes() != b"someone's tiktoken file"
    assert summary["tiktoken"]["output"] == str(tmp_path / "tok.tiktoken")


@pytest.mark.parametrize("kind", ["sentencepiece", "hf-bpe"])
def test_tokenizer_train_refuses_an_existing_output(inputs, tmp_path, capsys, kind):
    out = tmp_path / ("m.model" if kind == "sentencepiece" else "m.json")
    out.write_bytes(b"an existing model")
    assert cli.main(["tokenizer", "train", "--kind", kind, "--input", str(inputs / "*"), "--output", str(out),
                     "--vocab-size", "300"]) == 2
    assert "already exist" in _one_line(capsys) and out.read_bytes() == b"an existing model"


def test_tokenizer_train_never_writes_over_one_of_its_inputs(inputs, tmp_path, capsys):
    corpus = tmp_path / "c.jsonl.zst"
    corpus.write_bytes((inputs / "a.jsonl.zst").read_bytes())
    before = corpus.read_bytes()
    assert cli.main(["tokenizer", "train", "--input", str(tmp_path / "*.zst"), "--output", str(corpus),
                     "--vocab-size", "300", "--overwrite"]) == 2
    assert "is one of the --input files" in _one_line(capsys) and corpus.read_bytes() == before


def test_tokenizer_train_never_replaces_a_special_file_even_with_overwrite(tmp_path):
    """Hostile review: `tokenizer train --output /dev/null --overwrite` replaced the device with a regular file.
    A FIFO (and a link) at --output is refused with --overwrite too, before any training."""
    import pytest  # noqa: PLC0415
    from pipeline.errors import ConfigError  # noqa: PLC0415
    from pipeline.tools.tokenizer_train import check_outputs  # noqa: PLC0415

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "x"}\n')
    fifo = tmp_path / "out.model"
    os.mkfifo(fifo)
    link = tmp_path / "link.model"
    link.symlink_to(tmp_path / "elsewhere.model")
    for out in (fifo, link):
        with pytest.raises(ConfigError, match="not a regular file"):
            check_outputs([str(corpus)], [str(out)], overwrite=True)
    assert not (tmp_path / "elsewhere.model").exists()
    assert os.path.exists(fifo) and not os.path.isfile(fifo)
