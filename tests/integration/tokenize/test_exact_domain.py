"""The fast backend's proven-equal domain (transforms/tokenize/exact_domain.py) and the routing by it: the domain
is derived over all 1,114,112 code points (~1 minute), so these run outside `make test-fast`."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random

import pytest

from tests.unit.tokenize import crafted
from transforms.tokenize import exact_domain, tokenizer, tokenizer_backends as tb, tokenizer_cache

pytest.importorskip("gigatoken")
EXT_J = "\U000323B0"  # CJK Extension J: a letter in Unicode 17 (gigatoken), unassigned in Unicode 16 (tokenizers)


@pytest.fixture(scope="module")
def routed(hf_bpe):
    """`auto` on the trained byte-level BPE: gigatoken, routed by its derived domain."""
    path, _summary = hf_bpe
    spec = crafted.with_apostrophe_s(json.loads(path.read_bytes()))  # the trained vocabulary has no `'s`
    model = json.dumps(spec).encode()
    sp = tokenizer.load_processor(model)
    choice = tb.choose_backend("auto", model, sp, ["A plain sample document, it's fine.\n" * 20])
    assert choice.name == "gigatoken", choice.reason
    return model, sp, choice, tb.make_encoder(choice, model, sp)


def test_unicode17_letter_next_to_s_is_tokenized_as_hf_tokenizers(routed):
    model, sp, _choice, encoder = routed
    text = f"The {EXT_J}'s reading, and ab{EXT_J}'s too.\n"
    raw = tb._as_list(encoder._encode_all([text])[0])
    assert raw != sp.encode(text), "the two libraries agree here: the test would prove nothing"
    before = dict(encoder.counts)
    assert tb._as_list(encoder.encode(text)) == sp.encode(text)
    assert encoder.counts["reference_documents"] == before["reference_documents"] + 1
    assert encoder.counts["reference_bytes"] == before["reference_bytes"] + len(text.encode())
    plain = "An ordinary sentence, it's 42 words long.\n"
    assert tb._as_list(encoder.encode(plain)) == sp.encode(plain)
    assert encoder.counts["fast_documents"] == before["fast_documents"] + 1


def test_domain_is_checked_for_every_code_point_against_both_libraries(routed):
    """Independently of the derivation's blocks: every excluded code point differs between the two libraries
    on its own, and every code point of the domain, shuffled in another arrangement with ASCII, contractions,
    whitespace runs and digits, pre-tokenizes and encodes alike."""
    _model, sp, choice, encoder = routed
    domain = exact_domain.Domain.from_json(choice.domain_json)
    assert domain.compared == "ids+pretokens"
    excluded = {cp for a, b in domain.excluded_ranges for cp in range(a, b + 1)}
    assert ord(EXT_J) in excluded and not excluded & set(map(ord, "azAZ09 .,'\n"))
    giga, hf = exact_domain.boundaries_gigatoken(), exact_domain.boundaries_hf(sp._tok.pre_tokenizer)
    fast = lambda t: tb._as_list(encoder._encode_all([t])[0])  # noqa: E731
    for cp in sorted(excluded):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        text = exact_domain.probe(chr(cp))
        assert giga(text) != hf(text) or fast(text) != sp.encode(text), hex(cp)
    inside = [cp for cp in range(0x110000) if cp not in excluded]
    random.Random(7).shuffle(inside)
    fillers = ["'s", "'ll ", "  ", "\n\n", " 12", "x", "\t ", "don't "]
    for start in range(0, len(inside), 8192):
        text = "".join(chr(cp) + fillers[cp % len(fillers)] for cp in inside[start:start + 8192])
        assert giga(text) == hf(text), start
        assert fast(text) == sp.encode(text), start


def test_router_admits_only_the_domain():
    domain = exact_domain.Domain("gigatoken", "hf", "x", (), ((0x323B0, 0x323B4), (0xD800, 0xDFFF)), ("<odd>",))
    router = domain.router()
    assert router.admits("plain ascii") and router.admits("caf\u00e9")
    assert not router.admits(f"a{EXT_J}b") and not router.admits("x<odd>y") and not router.admits("\ud800")
    assert router.admits("\U000323B5")
    assert exact_domain.Domain.from_json(domain.to_json()) == domain


@pytest.mark.parametrize("ranges, texts", [
    (((0x88F, 0x88F), (0xD800, 0xDFFF), (0x10940, 0x10959), (0x323B0, 0x3347A)), ()),  # BMP and astral (HF-like)
    (((0x10000, 0x10000), (0x10FFFF, 0x10FFFF)), ()),  # the astral bounds alone
    (((0xFFFF, 0x10001),), ()),  # one range across U+FFFF
    (((0x88F, 0x88F), (0x323B0, 0x323B4)), ("<odd>",)),  # excluded texts: the single-pattern path
])
def test_router_admits_exactly_the_characters_outside_the_excluded_ranges(ranges, texts):
    """Every path of `admits` (one class; BMP class + astral runs) against the definition, on random text mixing
    ASCII, excluded and admitted BMP and astral characters, the range bounds and their neighbours."""
    router = exact_domain.Domain("gigatoken", "hf", "x", (), ranges, texts).router()
    near = {c for a, b in ranges for c in (a - 1, a, b, b + 1) if 0 <= c <= exact_domain.MAX_CODE_POINT}
    pool = [chr(c) for c in sorted(near | {0x41, 0xE9, 0xFFFF, 0x10000, 0x1F600, 0x10FFFF, 0x20000})] + ["<odd>"]
    rng = random.Random(17)
    for _ in range(3000):
        text = "".join(rng.choice(pool) if rng.random() < 0.3 else "ab " for _ in range(rng.randint(0, 12)))
        want = not any(a <= ord(c) <= b for c in text for a, b in ranges) and not any(t in text for t in texts)
        assert router.admits(text) is want, ascii(text)


def test_encoder_refuses_a_domain_that_does_not_match_its_digest(routed):
    model, sp, choice, _encoder = routed
    forged = exact_domain.Domain.from_json(choice.domain_json)
    forged = exact_domain.Domain(forged.backend, forged.kind, forged.tokenizer_sha256, forged.versions, (),
                                 (), forged.compared)
    with pytest.raises(tb.BackendMismatchError):
        tb.make_encoder(dataclasses.replace(choice, domain_json=forged.to_json()), model, sp)


def test_altered_tokenizer_cache_entry_is_detected_and_rebuilt(hf_bpe):
    model = hf_bpe[0].read_bytes()
    key = tb.gigatoken_json_key(model, "hf")
    path = tokenizer_cache.entry_path(tokenizer_cache.cache_dir(), key)
    want = tb.gigatoken_tokenizer_json(model, "hf")
    assert tb.cached_gigatoken_tokenizer_json(model, "hf") == want
    assert os.path.exists(path)
    data = open(path, "rb").read()
    altered = data.replace(b'"merges"', b'"merged"', 1) if b'"merges"' in data else data[:-10]
    assert altered != data
    with open(path, "wb") as f:
        f.write(altered)
    assert tb.cached_gigatoken_tokenizer_json(model, "hf") == want  # not the altered text
    head, _, content = open(path, "rb").read().partition(b"\n")
    assert json.loads(head)["content_sha256"] == hashlib.sha256(content).hexdigest()
    assert content.decode() == want
    # a stale entry (written for another file under this key's name) is refused too
    tokenizer_cache.write_entry(path, {**key, "source_sha256": "0" * 64}, b"{}")
    assert tb.cached_gigatoken_tokenizer_json(model, "hf") == want
