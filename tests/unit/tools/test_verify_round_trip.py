"""`verify --inputs` checks decode(tokens) against the text for a tokenizer with a normalizer too: against the
text as HF's own normalizer rewrites it (pipeline/tools/verify_inputs.py RoundTrip), and it says so; where no
check is possible (a normalizing SentencePiece model) the audit says that in a note instead of a silent
"0 round-tripped ... OK" (hostile review of issue 28, F3)."""
from __future__ import annotations

import collections

import numpy as np

from pipeline.tools import verify_inputs
from tests.unit.tokenize.crafted import added_token, as_bytes, byte_level_spec
from transforms.tokenize import tokenizer

LOWERCASE = {"type": "Lowercase"}


def _lowercase_tokenizer():
    data = as_bytes({**byte_level_spec([("h", "e")], added=[added_token(257, "<|endoftext|>")]),
                     "normalizer": LOWERCASE})
    return tokenizer.load_processor(data, "lower.json"), data


def _check(doc_text: str, stored: list, trip, eos: int):
    doc = verify_inputs.Sampled("in.jsonl:1", 7, doc_text, "Src", None)
    pieces = {7: [(0, np.asarray(stored), "train", "train-00000.tfrecord")]}
    counts, problems = collections.Counter(), []
    verify_inputs.check_document(doc, stored, pieces, verify_inputs.Removals(), trip, eos, counts, problems)
    return counts, problems


def test_a_lowercase_normalizer_is_round_tripped_against_the_normalized_text_and_said_so():
    ref, data = _lowercase_tokenizer()
    trip = verify_inputs.round_trip(ref, data)
    assert trip.decode is not None and "normalizer (Lowercase)" in trip.note, trip
    text = "The QUICK Brown FOX number 1"
    counts, problems = _check(text, list(ref.encode(text)) + [ref.eos_id()], trip, ref.eos_id())
    assert problems == [] and counts == {"written": 1, "round_trip_checked": 1}, (counts, problems)


def test_tokens_that_decode_to_neither_the_text_nor_its_normalized_form_are_a_problem():
    ref, data = _lowercase_tokenizer()
    trip = verify_inputs.round_trip(ref, data)
    text = "The QUICK Brown FOX"
    stored = list(ref.encode(text)) + [ref.eos_id()]
    # a decoder that loses the last character (a Removed split would): the round trip catches it
    lossy = verify_inputs.RoundTrip(lambda ids: ref.decode(ids)[:-1], trip.normalize, trip.note)
    counts, problems = _check(text, stored, lossy, ref.eos_id())
    assert counts["round_trip_checked"] == 0 and len(problems) == 1 and "does not round-trip" in problems[0]
    assert not trip.matches("The quick brown fox", text)  # half-normalized: neither the text nor lower-cased
    assert trip.matches("the quick brown fox", text) and trip.matches(text, text)


def test_without_a_normalizer_the_check_is_against_the_text_alone(tiny_tokenizer):
    data = as_bytes(byte_level_spec([("h", "e")], added=[added_token(257, "<|endoftext|>")]))
    ref = tokenizer.load_processor(data, "plain.json")
    trip = verify_inputs.round_trip(ref, data)
    assert trip.note == "" and trip.normalize is None
    assert not trip.matches("the quick", "The quick")
    model = open(tiny_tokenizer, "rb").read()  # identity normalizer, whitespace kept: checked as is
    sp = tokenizer.load_processor(model, "tiny.model")
    assert verify_inputs.round_trip(sp, model).decode is not None and verify_inputs.round_trip(sp, model).note == ""


def test_a_normalizing_sentencepiece_model_is_not_checked_and_the_audit_says_so():
    from tests.fixtures.sp_models import nfkc_unigram

    model = nfkc_unigram()
    sp = tokenizer.load_processor(model, "nfkc.model")
    trip = verify_inputs.round_trip(sp, model)
    assert trip.decode is None and "round trip NOT checked" in trip.note and "nmt_nfkc" in trip.note, trip
    from pipeline.tools.verify_report import AuditResult, VerifyReport

    report = VerifyReport("ds", audit=AuditResult(sampled=1, documents=1, round_trip_note=trip.note))
    assert f"  note: {trip.note}" in report.render().splitlines()
