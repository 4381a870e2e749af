"""Guards of the routing by construction (transforms/tokenize/exact_domain.py, tokenizer_backends.py) that the
issue-28 mutation check (docs/wip/mutation-issue28.md) found untested: each test fails when its guard is broken.
The derivations here run on stand-in encoders over a few code points, so they take milliseconds."""
from __future__ import annotations

import pytest

from tests.unit.tokenize.crafted import added_token, as_bytes, byte_level_spec
from transforms.tokenize import exact_domain, tokenizer, tokenizer_cache
from transforms.tokenize import tokenizer_backends as tb


def _ids(text: str) -> list:
    return [ord(c) for c in text]


def _derive(fast=_ids, texts=(), first=0xD7F0, last=0xE00F) -> exact_domain.Domain:
    return exact_domain.derive("fast", "hf", "f" * 64, fast, _ids, texts, None, first, last)


def test_surrogates_are_never_in_the_domain_even_where_the_encoders_agree():
    domain = _derive()  # the two encoders agree on every probe: only the surrogates are out
    assert domain.excluded_ranges == ((0xD800, 0xDFFF),)
    router = domain.router()
    assert not router.admits("a\ud800b") and router.admits("a\ue000b")


def test_an_added_token_text_the_encoders_disagree_on_is_excluded_as_a_whole():
    def fast(text):  # a backend that reads "<odd>" as one id where the reference reads its characters
        return _ids(text.replace("<odd>", "\x00"))

    domain = _derive(fast, texts=("<odd>", "<even>"), first=0x41, last=0x5A)
    assert domain.excluded_ranges == () and domain.excluded_texts == ("<odd>",)
    assert not domain.router().admits("before <odd> after") and domain.router().admits("<even> and ABC")


def test_a_code_point_whose_pre_tokens_differ_is_excluded_though_the_ids_agree():
    """A class difference this vocabulary happens to encode to the same ids is still outside the domain (a larger
    vocabulary would not encode it alike): the split points are compared too."""
    def fast_splits(text):  # the fast pre-tokenizer splits after every "B", the reference never
        return [i + 1 for i, c in enumerate(text) if c == "B"]

    domain = exact_domain.derive("fast", "hf", "f" * 64, _ids, _ids, (), (fast_splits, lambda _t: []), 0x41, 0x43)
    assert domain.compared == "ids+pretokens" and domain.excluded_ranges == ((0x42, 0x42),)


def test_a_domain_with_a_range_outside_unicode_is_refused_when_read():
    good = exact_domain.Domain("fast", "hf", "f" * 64, (), ((0x41, 0x42),))
    assert exact_domain.Domain.from_json(good.to_json()) == good
    for bad in (((0x41, 0x110000),), ((0x42, 0x41),), ((-1, 5),)):
        text = exact_domain.Domain("fast", "hf", "f" * 64, (), bad).to_json()
        with pytest.raises(ValueError, match="out of bounds"):
            exact_domain.Domain.from_json(text)


def test_a_cached_domain_that_describes_another_file_is_derived_again(monkeypatch):
    model = b"the tokenizer file"
    mine = _derive(first=0x41, last=0x42)
    mine = exact_domain.Domain("fast", "hf", tb.hashlib.sha256(model).hexdigest(), (), mine.excluded_ranges)
    other = exact_domain.Domain("fast", "hf", "0" * 64, (), ())  # verified content, but of another file
    monkeypatch.setattr(tokenizer_cache, "cached", lambda key, derive: other.to_json().encode("utf-8"))
    assert exact_domain.cached_domain("fast", "hf", model, lambda: mine) == mine
    wrong_backend = exact_domain.Domain("slow", "hf", mine.tokenizer_sha256, (), ())
    monkeypatch.setattr(tokenizer_cache, "cached", lambda key, derive: wrong_backend.to_json().encode("utf-8"))
    assert exact_domain.cached_domain("fast", "hf", model, lambda: mine) == mine


def test_the_domain_cache_is_keyed_by_the_library_versions(monkeypatch, tmp_path):
    monkeypatch.setenv(tokenizer_cache.TOKENIZER_CACHE_ENV, str(tmp_path))
    model = b"another tokenizer file"
    calls = []

    def derive():
        calls.append(1)
        return exact_domain.Domain("fast", "hf", tb.hashlib.sha256(model).hexdigest(), (), ())

    exact_domain.cached_domain("fast", "hf", model, derive)
    exact_domain.cached_domain("fast", "hf", model, derive)
    assert len(calls) == 1  # the second call read the verified entry
    monkeypatch.setattr(exact_domain, "versions", lambda: (("tokenizers", "99.0"),))
    exact_domain.cached_domain("fast", "hf", model, derive)
    assert len(calls) == 2  # another library version: derived again, never the old entry


def test_every_added_token_is_probed_by_the_derivation():
    data = as_bytes(byte_level_spec(added=[added_token(256, "<|endoftext|>"),
                                           added_token(257, "  ", special=False)]))
    ref = tokenizer.load_processor(data, "crafted")
    texts = tb.added_texts(data, ref)
    assert "<|endoftext|>" in texts and "  " in texts
