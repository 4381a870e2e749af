"""Tokenizer formats: detected from content, each encoded by its own library, special tokens always text."""
from __future__ import annotations

import json
import re

import pytest

from model_contract import DataContract, TokenizerInfo
from pipeline.tools.tokenizer_train import tiktoken_path_for
from tests.conftest import stdlib_texts
from transforms.tokenize import formats, references, tokenizer
from transforms.tokenize import tokenizer_backends as tb
from transforms.tokenize.formats import TokenizerOptions


def _texts() -> list:
    """Real text (standard library sources), whole files and their paragraphs."""
    whole = [text for _name, text in stdlib_texts(300_000)]
    return whole + [p for t in whole for p in t.split("\n\n") if p.strip()][:400]


def _with_specials(special: dict) -> list:
    """Documents that spell every special token of the vocabulary as text, alone, inside words and adjacent."""
    toks = sorted(special)
    return toks + [f"x{t}y {t}\n" for t in toks] + ["".join(toks), f"a {' '.join(toks)} b"]


def _load(path, options=TokenizerOptions()):
    data = tokenizer.read_model_bytes(str(path))
    return data, tokenizer.load_processor(data, str(path), options)


def _tiktoken_options(summary) -> TokenizerOptions:
    return TokenizerOptions(pattern=summary["tiktoken"]["pattern"],
                            special_tokens=summary["tiktoken"]["special_tokens"])


def test_format_is_read_from_content_and_anything_else_names_the_three(hf_bpe, tiny_tokenizer, tmp_path):
    path, summary = hf_bpe
    assert formats.detect(path.read_bytes()) == formats.HF_JSON
    assert formats.detect(open(tiny_tokenizer, "rb").read()) == formats.SENTENCEPIECE
    tik = tiktoken_path_for(str(path))
    assert formats.detect(open(tik, "rb").read()) == formats.TIKTOKEN
    # a directory holding a tokenizer.json is that file; misnamed files are still recognised by content
    assert _load(path.parent)[1].format == formats.HF_JSON
    renamed = tmp_path / "weird.model"
    renamed.write_bytes(path.read_bytes())
    assert references.format_of(_load(renamed)[1]) == formats.HF_JSON
    # random bytes, a JSON that is no tokenizer, text, bytes whose only "lines" are empty (not a tiktoken file),
    # and a directory without a tokenizer.json
    random_bytes = __import__("random").Random(0).randbytes(4096)
    (tmp_path / "empty-dir").mkdir()
    for name, data in (("x.json", b'{"a": 1}'), ("x.model", b"\x00\x01garbage"), ("x.txt", b"hello world\n"),
                       ("tokenizer.json", b"{not json"), ("r.bin", random_bytes), ("nl.bin", b"\n\x02\x08\x01"),
                       ("empty-dir", None)):
        bad = tmp_path / name
        if data is not None:
            bad.write_bytes(data)
        with pytest.raises(tokenizer.TokenizerError) as e:
            _load(bad)
        message = str(e.value)
        assert "SentencePiece .model" in message and "tokenizer.json" in message and "tiktoken" in message, message
        assert "\n" not in message and "src/sentencepiece" not in message and "INTERNAL" not in message
    with pytest.raises(tokenizer.TokenizerError, match="--tokenizer-pattern is required"):
        _load(tik)
    with pytest.raises(tokenizer.TokenizerError, match="--tokenizer-pattern"):
        _load(tik, TokenizerOptions(pattern="(unclosed"))


def test_eos_token_required_when_not_obvious_and_refused_when_not_in_vocab(hf_bpe):
    path, summary = hf_bpe
    tik = tiktoken_path_for(str(path))
    # two special tokens, one spelled as an EOS: that one; --eos-token picks another
    _data, hf = _load(path)
    assert (hf.eos_token, hf.eos_id()) == ("<|endoftext|>", 0)
    assert _load(path, TokenizerOptions(eos_token="<|padding|>"))[1].eos_id() == 1
    with pytest.raises(tokenizer.TokenizerError, match="--eos-token '<nope>' is not in"):
        _load(path, TokenizerOptions(eos_token="<nope>"))
    # tiktoken with two special tokens neither spelled as an EOS: --eos-token is required
    opts = TokenizerOptions(pattern="gpt2", special_tokens="<|a|>=700,<|b|>=701")
    with pytest.raises(tokenizer.TokenizerError, match="no single obvious end-of-document token.*--eos-token"):
        _load(tik, opts)
    assert _load(tik, TokenizerOptions(opts.pattern, opts.special_tokens, "<|b|>"))[1].eos_id() == 701
    with pytest.raises(tokenizer.TokenizerError, match="already a token"):
        _load(tik, TokenizerOptions(pattern="gpt2", special_tokens="<|a|>=5"))
    with pytest.raises(tokenizer.TokenizerError, match="is not TEXT=ID"):
        _load(tik, TokenizerOptions(pattern="gpt2", special_tokens="<|a|>"))


def test_special_tokens_written_in_a_document_are_text_in_every_format_and_backend(hf_bpe, tiny_tokenizer):
    path, summary = hf_bpe
    cases = [(str(path), TokenizerOptions()), (tiktoken_path_for(str(path)), _tiktoken_options(summary)),
             (tiny_tokenizer, TokenizerOptions())]
    for file, options in cases:
        data, ref = _load(file, options)
        special = references.special_tokens_of(ref)
        assert len(special) >= 2, file
        docs = _with_specials(special)
        control = set(special.values())
        for doc in docs:
            ids = ref.encode(doc)
            assert not control & set(ids), (file, doc, ids)
            assert ref.decode(ids) == doc  # byte-exact round trip: the text was encoded as text
        info = tokenizer.describe(ref, data, options)
        assert info.special_token_policy == "text" and info.special_tokens == special
        if references.format_of(ref) != formats.TIKTOKEN:
            giga = tb.GigatokenEncoder(data, ref, spot_check_every=1)  # every document re-checked too
            assert [list(giga.encode(d)) for d in docs] == [list(ref.encode(d)) for d in docs]


def test_tiktoken_file_of_the_same_merges_matches_the_json_bpe(hf_bpe):
    """The tiktoken file has the BPE vocabulary only (no added tokens): on text without whitespace runs, the
    json's HF encode and tiktoken's agree id for id."""
    path, summary = hf_bpe
    _data, hf = _load(path)
    _tdata, tik = _load(tiktoken_path_for(str(path)), _tiktoken_options(summary))
    texts = [re.sub(r"\t{2,}", "\t", re.sub(r" {4,}", " ", t)) for t in _texts()]
    assert len(texts) > 100
    assert [hf.encode(t) for t in texts] == [tik.encode(t) for t in texts]
    assert hf.encode("def f():\n        return 1") != tik.encode("def f():\n        return 1")  # the runs


def test_hf_bpe_has_gpt_neox_settings_and_both_kinds_of_added_tokens(hf_bpe):
    path, summary = hf_bpe
    spec = json.loads(path.read_bytes())
    assert spec["pre_tokenizer"] == {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                     "use_regex": True}
    assert spec["decoder"]["type"] == "ByteLevel" and spec["model"]["type"] == "BPE"
    added = {t["content"]: t["special"] for t in spec["added_tokens"]}
    assert added["<|endoftext|>"] is True and added["<|padding|>"] is True and added[" " * 4] is False
    assert summary["eos_token"] == "<|endoftext|>" and summary["special_tokens"] == {"<|endoftext|>": 0,
                                                                                     "<|padding|>": 1}
    _data, hf = _load(path)
    assert hf.encode("a" + " " * 4 + "b")[1] == spec["model"]["vocab"].__len__()  # the run is one added token
    # gigatoken is given the file minus its special added tokens only: the whitespace runs stay vocabulary
    given = json.loads(tb.gigatoken_tokenizer_json(path.read_bytes(), formats.HF_JSON))["added_tokens"]
    assert [t["content"] for t in given] == [text for text, special in added.items() if not special]
    data, _hf = _load(path)
    assert list(tb.GigatokenEncoder(data, hf).encode("a" + " " * 4 + "b")) == hf.encode("a" + " " * 4 + "b")


def test_contract_records_the_format_and_an_older_reader_still_reads_it(hf_bpe):
    path, summary = hf_bpe
    data, hf = _load(path)
    info = tokenizer.describe(hf, data)
    assert (info.kind, info.eos_id, info.eos_token, info.vocab_size) == (formats.HF_JSON, 0, "<|endoftext|>",
                                                                         hf.get_piece_size())
    contract = DataContract.for_tokens(128, info)
    d = contract.to_dict()
    assert d["version"] == "1.4"
    assert DataContract.from_dict(json.loads(json.dumps(d))) == contract
    # a 1.1 reader builds TokenizerInfo from the 1.1 fields only: the new ones do not stop it
    old_fields = ("kind", "model_sha256", "vocab_size", "bos_id", "eos_id", "pad_id", "unk_id")
    assert {k: d["tokenizer"][k] for k in old_fields}["eos_id"] == 0
    # a 1.1 contract (no new fields) reads as a SentencePiece model with the text policy
    old = {k: d["tokenizer"][k] for k in old_fields}
    old_info = TokenizerInfo.from_dict({**old, "kind": "sentencepiece"})
    assert old_info.special_token_policy == "text" and old_info.pattern == "" and old_info.eos_token == ""
    # what is needed to load the tokenizer again is in the contract (tiktoken's pattern and special tokens)
    tdata, tik = _load(tiktoken_path_for(str(path)), _tiktoken_options(summary))
    tinfo = tokenizer.describe(tik, tdata, _tiktoken_options(summary))
    again = tokenizer.load_for_info(tdata, TokenizerInfo.from_dict(json.loads(json.dumps(tinfo.to_dict()))))
    assert again.encode("hello <|endoftext|> world") == tik.encode("hello <|endoftext|> world")
    assert again.eos_id() == tinfo.eos_id == 0


@pytest.mark.parametrize("kind", [formats.SENTENCEPIECE, formats.HF_JSON, formats.TIKTOKEN])
def test_the_trainer_pins_each_format_by_its_files_sha256(kind, hf_bpe, tiny_tokenizer):
    """`--tokenizer SHA256` (trainer/dataset.py tokenizer_pin, checked by model_contract's check_compatible) against
    the contract the job writes (tokenizer.describe): the sha256 a user computes of the file on disk (`sha256sum`;
    the tokenizer.json inside a directory) is accepted, in either case; a wrong one is refused in one line
    naming both. A unit check of the pin, where tests/e2e/test_tokenizer_formats.py pins by path only."""
    import hashlib

    from model_contract import ContractMismatchError, Expectation, check_compatible
    from trainer.dataset import tokenizer_pin

    path, summary = hf_bpe
    file, given, options = {formats.SENTENCEPIECE: (tiny_tokenizer, tiny_tokenizer, TokenizerOptions()),
                            formats.HF_JSON: (str(path), str(path.parent), TokenizerOptions()),
                            formats.TIKTOKEN: (tiktoken_path_for(str(path)), tiktoken_path_for(str(path)),
                                               _tiktoken_options(summary))}[kind]
    data, proc = _load(given, options)
    contract = DataContract.for_tokens(128, tokenizer.describe(proc, data, options))
    assert contract.tokenizer.kind == kind
    with open(file, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()

    def pinned(pin: str) -> Expectation:
        return Expectation(128, contract.tokenizer.vocab_size, tokenizer_sha256=tokenizer_pin(pin))

    for pin in (sha, sha.upper(), given):
        check_compatible(contract, pinned(pin))
    wrong = hashlib.sha256(b"another tokenizer").hexdigest()
    with pytest.raises(ContractMismatchError) as e:
        check_compatible(contract, pinned(wrong))
    assert len(e.value.mismatches) == 1 and "\n" not in e.value.mismatches[0]
    assert sha[:12] in e.value.mismatches[0] and wrong[:12] in e.value.mismatches[0], e.value.mismatches
