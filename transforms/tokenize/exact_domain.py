"""Where a fast backend is proven to give the reference's ids: derived from both libraries, not sampled.

gigatoken's pre-tokenizer uses Unicode 17 character tables and HF `tokenizers` (onig) Unicode 16: a letter new in
Unicode 17 (U+323B0, CJK Extension J) next to `'s` is one pre-token `𲎰` + `'s` in gigatoken and `𲎰'` + `s` in
HF, so the ids differ. A sampled parity check cannot find every such document; this module routes by
construction instead. A backend's domain is the set of code points (and added-token texts) on which the two
libraries were compared and agree; a document goes to the fast backend only when every character of it is in the
domain (`Router.admits`), everything else to the reference (transforms/tokenize/tokenizer_backends.py).

`derive` compares the two libraries on every code point U+0000..U+10FFFF (surrogates are never in the domain:
they cannot be UTF-8), each inside a probe that puts it next to a letter, a digit, punctuation, `'s`, a space,
a tab and a newline (`probe`), so a code point whose character class differs between the libraries changes
either the pre-tokens or the ids of its probe:
- ids: the fast backend's encode against the reference's, for every probe (any tokenizer kind);
- pre-tokens (HF byte-level BPE with the GPT-2 regex, the pre-tokenizer gigatoken implements): the split points
  of gigatoken's pre-tokenizer against those of the file's own HF pre-tokenizer, so a class difference that this
  vocabulary happens to encode to the same ids is excluded too (a larger vocabulary would not).
Probes are compared in blocks of BLOCK code points; a block that differs is halved until the differing code
points are found, so the cost is one pass plus a few probes per excluded code point. The added tokens given to
the fast backend (and the special tokens' text, which both must treat as text) are probed alone, doubled and
between words; a text on which they differ is excluded as a whole (`excluded_texts`).

The domain's digest (with the libraries' versions and the tokenizer file's sha256) is part of the unit resume
key (pipeline/shard/markers.py backend_key), and the derivation is cached on disk per (versions, file)
(transforms/tokenize/tokenizer_cache.py).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
from dataclasses import dataclass
from typing import Callable, Optional

from transforms.tokenize import tokenizer_cache

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)
BLOCK = 2048
# Bumped whenever `probe`, `derive` or the Domain's fields change: the cache key and the digest hold it.
DERIVATION_FORMAT = 1
_DISTRIBUTIONS = ("gigatoken-cachefix", "tokenizers", "sentencepiece", "kitoken", "splintr-rs")


def probe(c: str) -> str:
    """The text a code point is compared in: beside a letter, `'s`, a digit, punctuation, a space, a tab, a
    newline (each adjacency separates one pair of the GPT-2 regex's classes \\p{L}, \\p{N}, \\s and the rest)."""
    return f"a{c}'s0{c}!{c}\t{c}\n"


@dataclass(frozen=True)
class Domain:
    """What is proven equal between a fast backend and its reference for one tokenizer file."""
    backend: str
    kind: str
    tokenizer_sha256: str
    versions: tuple[tuple[str, str], ...]  # (distribution, version) of the libraries compared
    # (first, last) inclusive code point ranges outside the domain, surrogates included
    excluded_ranges: tuple[tuple[int, int], ...]
    excluded_texts: tuple[str, ...] = ()  # added-token / special-token texts the two encode differently
    compared: str = ""  # what was compared: "ids", or "ids+pretokens"

    def to_json(self) -> str:
        return json.dumps({"format": DERIVATION_FORMAT, "backend": self.backend, "kind": self.kind,
                           "tokenizer_sha256": self.tokenizer_sha256, "versions": [list(v) for v in self.versions],
                           "excluded_ranges": [list(r) for r in self.excluded_ranges],
                           "excluded_texts": list(self.excluded_texts), "compared": self.compared},
                          sort_keys=True, ensure_ascii=True)

    @classmethod
    def from_json(cls, text: str) -> "Domain":
        d = json.loads(text)
        if not isinstance(d, dict) or d.get("format") != DERIVATION_FORMAT:
            raise ValueError("not a domain of this derivation format")
        ranges = tuple((int(a), int(b)) for a, b in d["excluded_ranges"])
        if any(not 0 <= a <= b <= MAX_CODE_POINT for a, b in ranges):
            raise ValueError("a code point range out of bounds")
        texts = tuple(d["excluded_texts"])
        if not all(isinstance(t, str) and t for t in texts):
            raise ValueError("an excluded text that is not a non-empty string")
        return cls(str(d["backend"]), str(d["kind"]), str(d["tokenizer_sha256"]),
                   tuple((str(a), str(b)) for a, b in d["versions"]), ranges, texts, str(d.get("compared", "")))

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    @property
    def excluded_code_points(self) -> int:
        return sum(b - a + 1 for a, b in self.excluded_ranges)

    def router(self) -> "Router":
        return Router(self)


class Router:
    """`admits(text)`: True when every character of the text is in the domain and no excluded text occurs in it.

    One precompiled `re` character class of the excluded ranges (plus the excluded texts as alternatives): the
    search runs in C over the text and stops at the first hit; ASCII text skips it when no ASCII character or
    excluded text can match (str.isascii reads a flag of the string).

    Excluded ranges above U+FFFF make that class slow: `re` keeps the BMP part of a class as a bitmap but tests
    every range above it one by one for each character, and a domain with 19 such ranges (an HF byte-level BPE,
    Unicode 16 against 17) spent 3.3 CPU-s in `admits` on the 384 MB bench corpus, ~14% of the job's CPU
    (docs/BENCHMARKS.md "Routing by construction"). So, with no excluded texts, the scan is a class of the
    excluded BMP ranges plus all of U+10000..U+10FFFF as one range (a bitmap and one comparison per character);
    a hit above U+FFFF takes the run of such characters there and checks only that run against the excluded
    ranges above U+FFFF (0.38 CPU-s on the same documents, the same answers)."""

    def __init__(self, domain: Domain):
        ranges, texts = domain.excluded_ranges, domain.excluded_texts
        parts = []
        if ranges:
            parts.append(_class(ranges))
        parts += [re.escape(t) for t in sorted(texts, key=lambda t: (-len(t), t))]
        self._search = re.compile("|".join(parts)).search if parts else None
        self._ascii_free = all(a > 0x7F for a, _b in ranges) and not any(t.isascii() for t in texts)
        astral = [(max(a, 0x10000), b) for a, b in ranges if b > 0xFFFF]
        self._coarse = None
        if astral and not texts:
            bmp = [(a, min(b, 0xFFFF)) for a, b in ranges if a <= 0xFFFF]
            self._coarse = re.compile(_class([*bmp, (0x10000, MAX_CODE_POINT)])).search
            self._astral_run = re.compile(_class([(0x10000, MAX_CODE_POINT)]) + "+").match
            self._astral_search = re.compile(_class(astral)).search

    def admits(self, text: str) -> bool:
        if self._search is None or (self._ascii_free and text.isascii()):
            return True
        if self._coarse is None:
            return self._search(text) is None
        at = 0
        while True:
            hit = self._coarse(text, at)
            if hit is None:
                return True
            if hit.group() <= "\uffff":  # an excluded BMP character
                return False
            run = self._astral_run(text, hit.start())
            if self._astral_search(run.group()) is not None:
                return False
            at = run.end()


def _class(ranges) -> str:
    return "[" + "".join(_class_range(a, b) for a, b in ranges) + "]"


def _class_range(a: int, b: int) -> str:
    def esc(cp: int) -> str:
        return f"\\U{cp:08x}"
    return esc(a) if a == b else f"{esc(a)}-{esc(b)}"


def _ranges(points: list) -> tuple:
    out: list = []
    for cp in sorted(points):
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return tuple((a, b) for a, b in out)


def _as_list(ids) -> list:
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)


def versions() -> tuple:
    """The versions of every library a domain can depend on (a missing one is "")."""
    out = []
    for dist in _DISTRIBUTIONS:
        try:
            out.append((dist, importlib.metadata.version(dist)))
        except importlib.metadata.PackageNotFoundError:
            out.append((dist, ""))
    return tuple(out)


def gigatoken_pretokenizer_applies(spec: Optional[dict]) -> bool:
    """True when the HF file's pre-tokenizer is a ByteLevel with the GPT-2 regex (GPT-2, GPT-NeoX, the hf-bpe
    kind of pipeline/tools/tokenizer_train.py): the one gigatoken's `pretokenizer` implements, so its split
    points can be compared with HF's."""
    pre = (spec or {}).get("pre_tokenizer") or {}
    return pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space")


def boundaries_hf(pre_tokenizer) -> Callable[[str], list]:
    def split(text: str) -> list:
        return [end for _piece, (_start, end) in pre_tokenizer.pre_tokenize_str(text)]
    return split


def boundaries_gigatoken() -> Callable[[str], list]:
    from gigatoken.gigatoken_rs import pretokenizer  # noqa: PLC0415 - only for gigatoken's domain

    def split(text: str) -> list:
        out, at = [], 0
        for piece in pretokenizer(text.encode("utf-8")):
            at += len(piece.decode("utf-8"))
            out.append(at)
        return out
    return split


def differing(points: list, same: Callable[[str], bool]) -> list:
    """The code points whose probes differ: a block is compared at once and halved while it differs."""
    if not points:
        return []
    if same("".join(probe(chr(cp)) for cp in points)):
        return []
    if len(points) == 1:
        return points
    mid = len(points) // 2
    return differing(points[:mid], same) + differing(points[mid:], same)


def derive(backend: str, kind: str, tokenizer_sha256: str, fast_encode: Callable, reference_encode: Callable,
           texts: tuple = (), pretokenizers: Optional[tuple] = None, first: int = 0,
           last: int = MAX_CODE_POINT) -> Domain:
    """The domain of `fast_encode` against `reference_encode` (text -> ids) over code points first..last (the
    tests pass a sub-range only to break the derivation on purpose); `texts`: the added and special tokens'
    texts; `pretokenizers`: (fast, reference) split-point functions when the pre-tokens can be compared too."""
    def same(text: str) -> bool:
        if pretokenizers is not None and pretokenizers[0](text) != pretokenizers[1](text):
            return False
        return _as_list(fast_encode(text)) == _as_list(reference_encode(text))

    excluded: list = []
    for start in range(first, last + 1, BLOCK):
        block = [cp for cp in range(start, min(start + BLOCK, last + 1))
                 if not SURROGATES[0] <= cp <= SURROGATES[1]]
        excluded += differing(block, same)
    excluded += range(max(first, SURROGATES[0]), min(last, SURROGATES[1]) + 1)
    bad_texts = sorted({t for t in texts if t and not all(
        same(s) for s in (t, t + t, f"a{t}b", f" {t} ", f"x{t}'s\n", f"1{t}{t}2"))})
    return Domain(backend, kind, tokenizer_sha256, versions(), _ranges(excluded), tuple(bad_texts),
                  "ids+pretokens" if pretokenizers is not None else "ids")


def cached_domain(backend: str, kind: str, model_bytes: bytes, derive_it: Callable[[], Domain]) -> Domain:
    """derive_it()'s domain, from the local cache when a verified entry (same file, versions, format) is there."""
    key = {"what": "exact-domain", "backend": backend, "kind": kind,
           "source_sha256": hashlib.sha256(model_bytes).hexdigest(), "versions": [list(v) for v in versions()],
           "format": DERIVATION_FORMAT}
    content = tokenizer_cache.cached(key, lambda: derive_it().to_json().encode("utf-8"))
    try:
        domain = Domain.from_json(content.decode("utf-8"))
    except (ValueError, KeyError, TypeError):
        domain = None
    if domain is None or domain.backend != backend or domain.tokenizer_sha256 != key["source_sha256"]:
        domain = derive_it()  # an entry whose content verified but does not describe this file: never used
    return domain
