"""Issue 30's measuring stick (bench/megatron_tokenizer.py, bench/megatron_corpus.py, bench/megatron_fast.py):
Llama 2 as the HF tokenizer dir Megatron's fast script loads, the distinct copies of the 1.5 GB corpus, and the
pileprep ÷ fast tables. Megatron itself is not run here (it is a benchmark: bench/megatron_side_by_side.py)."""
from __future__ import annotations

import importlib
import json

import pytest
import zstandard

from tests.conftest import REPO, shared_data

# SentencePiece's own quirks the HF dir must keep: the dummy prefix on a leading space, runs of spaces (the
# whitespace-only pieces score -1e9 in Llama 2), newlines, byte fallback
TEXTS = ["hello world", " leading space", "a   b\n\n  c", "\tdef f(x):\n        return  x\n", "naïve 日本語 🤖",
         "  ", "x" * 300, "1234567 + 89"]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    return lambda name: importlib.import_module(name)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    import sys  # noqa: PLC0415

    sys.path.insert(0, str(REPO / "bench"))
    try:
        tokenizer = importlib.import_module("megatron_tokenizer")
    finally:
        sys.path.remove(str(REPO / "bench"))
    model = str(shared_data("tokenizers", "llama2-bpe-32k.model"))
    return model, tokenizer.build_hf_dir(model, str(tmp_path_factory.mktemp("hf") / "llama2-hf"))


def test_the_hf_dir_tokenizes_as_sentencepiece_but_literal_special_text(hf_dir, bench):
    import sentencepiece as spm  # noqa: PLC0415
    from transformers import AutoTokenizer  # noqa: PLC0415

    model, out = hf_dir
    sp = spm.SentencePieceProcessor(model_file=model)
    hf = AutoTokenizer.from_pretrained(out)  # what Megatron's HuggingFaceTokenizer loads
    giga = bench("megatron_tokenizer").load_gigatoken(out).tokenizer  # what its --use-gigatoken path runs
    for text in TEXTS:
        assert hf(text).input_ids == sp.encode(text), text
        assert list(giga.encode(text)) == sp.encode(text), text
    # the known inexactness of Megatron's fast path: "<s>" in the text becomes the control token
    assert sp.piece_to_id("<s>") in list(giga.encode("x <s> y"))
    assert sp.piece_to_id("<s>") not in sp.encode("x <s> y")


def test_merges_are_ranked_by_the_merged_piece_score(hf_dir, bench):
    import sentencepiece as spm  # noqa: PLC0415

    model, _out = hf_dir
    sp = spm.SentencePieceProcessor(model_file=model)
    vocab, merges = bench("megatron_tokenizer").score_ordered(model)
    scores = [sp.get_score(vocab[left + right]) for left, right in merges]
    assert scores == sorted(scores, reverse=True)
    ids = [vocab[left + right] for left, right in merges]
    assert ids != sorted(ids)  # Llama 2's whitespace pieces: id order is not score order


def test_copies_are_distinct_documents(tmp_path, bench):
    base = tmp_path / "00.jsonl.zst"
    lines = [json.dumps({"text": t, "meta": {"pile_set_name": "X"}}) + "\n" for t in ("a b", "c\n")]
    base.write_bytes(zstandard.ZstdCompressor().compress("".join(lines).encode()))
    corpus = bench("megatron_corpus")
    copies = [list(corpus._copy_lines(str(base), j)) for j in range(3)]
    assert b"".join(copies[0]) == "".join(lines).encode()  # copy 0 is the sample itself
    records = [json.loads(line) for copy in copies for line in copy]
    assert len({r["text"] for r in records}) == 6
    assert [r["meta"].get("bench_copy") for r in records] == [None, None, 1, 1, 2, 2]
    assert records[4]["text"] == "a b" + corpus.MARKER.format(j=2)


@pytest.mark.parametrize("size", ["16y96", "x96", "16x", "1.5", "0", "0x96", "16x0"])
def test_a_size_is_n_or_k_copies_of_n(size, bench, tmp_path):
    """review30 added 0, 0x96, 16x0: an empty corpus was built and run, each tool's first run failing or dividing
    by zero tokens, after the corpora before it had been timed. The cache is tmp_path: a size let through builds
    its corpus there."""
    with pytest.raises(SystemExit, match="--sizes"):
        bench("megatron_side_by_side").corpus_for(str(tmp_path), size, "")


def _run(wall, cpu, tokens, rss):
    return {"wall": wall, "cpu_s": cpu, "tokens": tokens, "largest_mb": rss, "tree_mb": rss}


def _two_sizes(fast, pileprep_cpu_at_1536: float = 66) -> list:
    """The fast script and pileprep ("p") at 384 MB and 1536 MB, as bench/megatron_fast.py's rows."""
    return [("384 MB", 10, None, {fast.FAST: _run(20, 25, 100e6, 2000), "p": _run(18, 30, 100e6, 500)}),
            ("1536 MB", 40, None, {fast.FAST: _run(50, 65, 500e6, 7000),
                                   "p": _run(38, pileprep_cpu_at_1536, 500e6, 520)})]


def test_marginal_ratios_and_targets(capsys, bench):
    fast = bench("megatron_fast")
    rows = _two_sizes(fast)
    fast.print_fast_tables(rows, ["p"], lambda tool, r: tool)
    out = capsys.readouterr().out
    # fast: 40 CPU-s over 400 M tokens = 0.100 per M; pileprep 36 over 400 M = 0.090: 0.90 of it
    assert "| 384 MB → 1536 MB | p | 0.090 | 0.050 | 0.90 | 0.67 | 1.04 |" in out
    assert "wall ÷ fast 0.76 (target <= 0.80): met" in out
    assert "marginal CPU per token ÷ fast 0.90 (target <= 1.00): met" in out
    assert "peak RSS ÷ fast 0.07 (target <= 0.50): met" in out
    rows[1][3][fast.FAST]["cpu_s"] = 20  # less CPU at the larger size (noise): no ratio, no verdict
    fast.print_fast_tables(rows, ["p"], lambda tool, r: tool)
    assert "marginal CPU per token ÷ fast n/a (target <= 1.00): not measured" in capsys.readouterr().out


def test_a_negative_marginal_of_pileprep_is_no_verdict(capsys, bench):
    """review30: pileprep's CPU lower at the larger size (noise, a slow stretch under the small size's runs) made
    its marginal cost negative, and a negative ratio passed `<= 1.0` as "met"."""
    fast = bench("megatron_fast")
    rows = _two_sizes(fast, pileprep_cpu_at_1536=20)
    fast.print_fast_tables(rows, ["p"], lambda tool, r: tool)
    out = capsys.readouterr().out
    assert "marginal CPU per token ÷ fast n/a (target <= 1.00): not measured" in out
    assert ": met" not in out.split("marginal CPU per token")[1].splitlines()[0]


def test_two_sizes_with_the_same_tokens_print_their_tables(capsys, bench):
    """review30: `--sizes 96 1x96` (or a size given twice) gives two rows with the same tokens; the marginal
    divided by zero and the bench died in its last step, every run's figures lost."""
    fast = bench("megatron_fast")
    rows = [(label, 10, None, {fast.FAST: _run(20, 25, 100e6, 2000), "p": _run(18, 30, 100e6, 500)})
            for label in ("96 MB", "96 MB (1×96)")]
    fast.print_fast_tables(rows, ["p"], lambda tool, r: tool)
    out = capsys.readouterr().out
    assert "marginal CPU per token ÷ fast n/a (target <= 1.00): not measured" in out
    assert "wall ÷ fast 0.90 (target <= 0.80): MISSED" in out


def test_a_bad_size_is_refused_before_any_size_runs(tmp_path, monkeypatch, bench):
    """review30: `--sizes 384 16y96` timed the whole 384 MB part (minutes) before refusing the typo."""
    for name in ("MEGATRON_DIR", "MEGATRON_FAST_DIR"):
        monkeypatch.delenv(name, raising=False)
    side = bench("megatron_side_by_side")
    built = []
    monkeypatch.setattr(side, "corpus_for", lambda *a: built.append(a) or (_ for _ in ()).throw(RuntimeError))
    tokenizer = tmp_path / "t.model"
    tokenizer.write_bytes(b"")
    with pytest.raises(SystemExit, match="--sizes 16y96"):
        side.main(["--sizes", "384", "16y96", "--tokenizer", str(tokenizer), "--cache-dir", str(tmp_path)])
    assert built == []
