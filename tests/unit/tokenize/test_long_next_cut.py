"""A long document with no piece boundary within the first piece is cut at the next boundary after it, and that
cut keeps added tokens whole too (transforms/tokenize/long_documents.py _next_cut). Found untested by the issue-28
mutation check (docs/wip/mutation-issue28.md): tests/unit/tokenize/test_long_added_tokens.py cuts only within a
piece (_last_cut)."""
from __future__ import annotations

from tests.unit.tokenize.test_long_added_tokens import _spec_bytes
from transforms.tokenize import long_documents as ld
from transforms.tokenize import tokenizer

PIECE = 20


def test_the_cut_after_a_boundless_piece_keeps_an_added_token_whole():
    data = _spec_bytes()
    ref = tokenizer.load_processor(data, "crafted")
    text = "x" * 40 + "New York wo" + " wo" * 10  # no boundary in the first 20 characters; the next is in "New York"
    inside = text.index("New York") + 3
    plan = ld.plan(ref, data, piece_chars=PIECE)
    assert ld.cuts(text, PIECE, plan.max_pretoken_bytes)[0] == inside  # the rule without added tokens
    bounds = ld.cuts(text, PIECE, plan.max_pretoken_bytes, plan.added)
    assert bounds and inside not in bounds
    assert tokenizer.encode_batch(ref, [text], plan)[0].tolist() == ref.encode(text)
