"""A long document cut into pieces keeps its added tokens whole: a cut never falls inside a multi-word added token
nor beside one that strips whitespace (transforms/tokenize/long_documents.py), with the reference and gigatoken."""
from __future__ import annotations

import pytest

from tests.unit.tokenize.crafted import added_token, as_bytes, byte_level_spec
from transforms.tokenize import long_documents as ld
from transforms.tokenize import tokenizer
from transforms.tokenize import tokenizer_backends as tb

MERGES = [("N", "e"), ("Ne", "w"), ("Ġ", "Y"), ("ĠY", "o"), ("ĠYo", "r"), ("ĠYor", "k"), ("Ġ", "w"), ("Ġw", "o")]


def _spec_bytes() -> bytes:
    return as_bytes(byte_level_spec(MERGES, added=[
        added_token(264, "<|endoftext|>"),
        added_token(265, "New York", special=False),
        added_token(266, "<r>", special=False, rstrip=True),
        added_token(267, "<l>", special=False, lstrip=True)]))


def _document(token: str) -> tuple:
    """(text, piece size, where a cut would harm the token): a text whose last single space within the first
    piece is inside `token` ("New York") or beside it (after `<r>`, before `<l>`)."""
    head = "wo " * 30
    text = head + f"wo {token} " + "x" * 40 + " wo wo"
    start = text.index(token)
    at = {"New York": start + 3, "<r>": start + 3, "<l>": start - 1}[token]
    return text, at + 1, at


@pytest.mark.parametrize("token", ["New York", "<r>", "<l>"])
def test_a_cut_keeps_an_added_token_whole(token):
    data = _spec_bytes()
    ref = tokenizer.load_processor(data, "crafted")
    text, piece_chars, harmful = _document(token)
    plan = ld.plan(ref, data, piece_chars=piece_chars)
    assert plan.exact and {t[0] for t in plan.added} == {"New York", "<r>", "<l>"}
    assert harmful in ld.cuts(text, piece_chars, plan.max_pretoken_bytes)  # the rule without added tokens
    bounds = ld.cuts(text, piece_chars, plan.max_pretoken_bytes, plan.added)
    assert bounds and harmful not in bounds  # cut, only not at the token
    whole = ref.encode(text)
    assert tokenizer.encode_batch(ref, [text], plan)[0].tolist() == whole
    if token != "<l>":  # lstrip takes the space before it, which a cut gives to the token's own piece anyway
        naive = ld.encode_in_pieces(lambda piece: ref.encode(piece), text, False, piece_chars,
                                    plan.max_pretoken_bytes)
        assert naive.tolist() != whole  # the cut the old rule made changes the ids


def test_gigatoken_in_pieces_keeps_the_added_token():
    data = _spec_bytes()
    ref = tokenizer.load_processor(data, "crafted")
    try:
        encoder = tb.GigatokenEncoder(data, ref, spot_check_every=1)
    except (ImportError, ValueError) as e:
        pytest.skip(f"gigatoken not usable here: {e}")
    text, piece_chars, _at = _document("New York")
    got = tokenizer.encode_batch(encoder, [text], ld.plan(encoder, data, piece_chars=piece_chars))[0]
    assert got.tolist() == ref.encode(text)
