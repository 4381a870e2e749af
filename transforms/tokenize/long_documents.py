r"""Long documents tokenized exactly in pieces: ids equal the whole document's, memory bounded by the piece size.

A piece boundary is a space after a non-space character and before another one ("x y"). None of the formats'
encoders can join tokens across it:
- SentencePiece BPE/unigram with the identity normalizer and no whitespace collapsing: spaces become `▁`, and a
  vocabulary with no piece holding `▁` after another character (checked, `piecewise_reason`) cannot merge
  across "x▁y"; each side's merges (and Viterbi path) are then independent. With the dummy prefix the whole text
  gets one leading `▁`: a later piece is encoded without its space, which the prefix gives back. Byte fallback is
  per character, so it is not affected.
- HF byte-level BPE (GPT-2/GPT-NeoX pre-tokenizer) and tiktoken's gpt2/cl100k/o200k patterns: no alternative of
  these patterns consumes a space after a non-space character (letters, digits, punctuation and contractions end
  before it), so a pre-token always starts at that space, and the match from there on sees the same characters
  (its lookaheads look forward only; the piece before ends in a non-space, so `\s+$` cannot match at its end).
  BPE never crosses pre-tokens. HF added tokens are matched before pre-tokenizing, on the whole text: a cut is
  not made inside an occurrence of one that holds a space ("New York"), nor beside one that strips whitespace
  (`rstrip` eats the space after it, `lstrip` the one before), so each piece sees the same matches
  (`LongDocuments.added`; tests/unit/tokenize/test_long_documents.py has a document with one on a cut).
A stretch of more than `max_pretoken_bytes` of UTF-8 without such a boundary (one huge token-less run) is the
caller's to dead-letter (`pretoken_too_long`): it is encoded in one call, whose memory grows with its length. Bytes,
not characters: the encoders' memory follows the bytes (measured with the Llama 2 model on a 16 Mi-character run
of astral characters, 64 MiB: gigatoken's one call peaked 1.6 GB above its start, sp.encode 0.96 GB; on 16 MiB of
digits 0.40 and 0.90 GB; bench/memory_bench.py has the whole-run figures). Its time is bounded by the same limit:
BPE over one pre-token grows faster than its length in every encoder, ~5-7x per 4x, not quadratically (16x).
Measured, CPU seconds of one call on 1 / 4 / 16 MiB of letters (English with spaces and punctuation removed),
an 8k byte-level BPE from `pileprep tokenizer train --kind hf-bpe`: tiktoken 0.70 / 5.1 / 25, HF tokenizers
1.1 / 5.6 / 28, gigatoken 0.24 / 1.9 / 12; the Llama 2 model: sp.encode 0.65 / 3.4 / 16, gigatoken 0.82 / 5.6 /
32 (a shared 2-core host, load 3-5). The whole `pileprep shard` of such a 16 MiB document took 24 s of CPU
(tiktoken) and 30 s (Llama 2, gigatoken), so the default --max-pretoken-mb needs no lower value for time; each
doubling of it costs ~2.5x.
Exactness is also measured: tests/unit/tokenize/test_long_documents.py compares with whole-document encoding on
every document of the sample data cut into tiny pieces.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import numpy as np

from transforms.tokenize import formats, references

PIECE_CHARS = 1 << 20  # ~1 MiB pieces: the encoders' memory per call stays that of a 1 MiB text
DEFAULT_MAX_PRETOKEN_BYTES = 16 << 20
PRETOKEN_TOO_LONG = "pretoken_too_long"
# A single space between two characters that are neither whitespace nor U+2581: SentencePiece writes the space as
# U+2581, so beside a literal U+2581 it would merge across the cut ("\u2581 \u2581" is one Llama 2 piece whole,
# two in pieces; docs/wip/newcomer-mutations.md).
_CUT = re.compile("(?<=[^\\s\u2581]) (?=[^\\s\u2581])")
_SPACE_MARK = "\u2581"
_SAFE_HF_NORMALIZERS = (None, "NFC")


@dataclass(frozen=True)
class LongDocuments:
    """How a worker encodes texts longer than `piece_chars`: in pieces when `exact`, else whole (`reason`)."""
    exact: bool = False
    reason: str = ""
    dummy_prefix: bool = False
    piece_chars: int = PIECE_CHARS
    max_pretoken_bytes: int = DEFAULT_MAX_PRETOKEN_BYTES
    # (content, lstrip, rstrip) of the added tokens a cut must not split (HF tokenizer.json)
    added: tuple[tuple[str, bool, bool], ...] = ()


def plan(sp, model_bytes: Optional[bytes], max_pretoken_bytes: int = DEFAULT_MAX_PRETOKEN_BYTES,
         piece_chars: int = PIECE_CHARS) -> LongDocuments:
    reference = getattr(sp, "reference", sp)
    reason = piecewise_reason(reference, model_bytes)
    return LongDocuments(not reason, reason, dummy_prefix(reference, model_bytes),
                         min(piece_chars, max_pretoken_bytes), max_pretoken_bytes, cut_sensitive(reference))


def cut_sensitive(sp) -> tuple:
    """The added tokens (content, lstrip, rstrip) that a cut at a space could change: those holding a space, and
    those stripping whitespace beside them. SentencePiece's user pieces with a space are refused by
    piecewise_reason; tiktoken encodes no added token in text (encode_ordinary)."""
    return tuple(t for t in getattr(sp, "added", ()) if " " in t[0] or t[1] or t[2])


class PretokenTooLong(ValueError):
    """A stretch of the document without a piece boundary is longer than --max-pretoken-mb."""


def piecewise_reason(sp, model_bytes: Optional[bytes] = None) -> str:
    """Why this tokenizer cannot be encoded in pieces exactly, or "" when it can."""
    kind = references.format_of(sp)
    if kind == formats.SENTENCEPIECE:
        if model_bytes is None:
            return "the SentencePiece model's bytes are needed to check its pieces"
        from transforms.tokenize import tokenizer_backends as tb  # noqa: PLC0415 - the proto reader lives there

        spec = tb._spec(model_bytes)  # noqa: SLF001 - one reader of the proto for the package
        if spec["charsmap"] or spec["remove_extra_whitespaces"] or not spec["escape_whitespaces"] \
                or spec["treat_whitespace_as_suffix"]:
            return "the model normalizes text (charsmap or whitespace flags)"
        if any(re.search("[^\u2581]\u2581", piece) for piece, _s, _k in tb.model_pieces(model_bytes)):
            return "a piece of the model spans a space inside a word"
        return ""
    if kind == formats.TIKTOKEN:
        names = {formats.PATTERNS[n] for n in ("gpt2", "cl100k", "o200k")}
        return "" if sp.pattern in names else "a custom tiktoken pattern"
    spec = getattr(sp, "spec", None) or {}
    normalizer = (spec.get("normalizer") or {}).get("type")
    pre = spec.get("pre_tokenizer") or {}
    if normalizer not in _SAFE_HF_NORMALIZERS:
        return f"the {normalizer} normalizer"
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True) or pre.get("add_prefix_space"):
        return "not the GPT-2 byte-level pre-tokenizer"
    return ""


def _blocked(text: str, i: int, added: tuple) -> bool:
    """Whether a cut before the space at `i` would split an added token's occurrence or separate a stripping one
    from the space beside it (in the whole text it takes that space; the cut would give it to the next piece)."""
    for content, lstrip, rstrip in added:
        n = len(content)
        if n > 1 and text.find(content, max(0, i - n + 1), i + n - 1) >= 0:  # an occurrence starting in
            return True  # [i-n+1, i-1] ends at or after i+1: it spans the cut
        if (rstrip and text.endswith(content, 0, i)) or (lstrip and text.startswith(content, i + 1)):
            return True
    return False


def _last_cut(text: str, lo: int, hi: int, added: tuple = ()) -> int:
    """The last boundary in (lo, hi], or -1."""
    i = text.rfind(" ", lo + 1, hi + 1)
    while i > lo:
        if i + 1 < len(text) and not text[i - 1].isspace() and not text[i + 1].isspace() \
                and _SPACE_MARK not in (text[i - 1], text[i + 1]) and not (added and _blocked(text, i, added)):
            return i
        i = text.rfind(" ", lo + 1, i)
    return -1


def _next_cut(text: str, start: int, added: tuple) -> int:
    """The first boundary at or after `start`, or len(text)."""
    for m in _CUT.finditer(text, start):
        if not (added and _blocked(text, m.start(), added)):
            return m.start()
    return len(text)


def cuts(text: str, piece_chars: int = PIECE_CHARS, max_pretoken_bytes: int = DEFAULT_MAX_PRETOKEN_BYTES,
         added: tuple = ()) -> list:
    """Start offsets of the pieces after the first: each the last boundary within `piece_chars` of the previous
    one, or the first one after it; PretokenTooLong when a stretch longer than `max_pretoken_bytes` has none.
    `added`: LongDocuments.added, the added tokens no cut may split."""
    out = []
    pos, n = 0, len(text)
    while n - pos > piece_chars:
        cut = _last_cut(text, pos, pos + piece_chars, added)
        if cut < 0:  # no boundary within a piece: the stretch runs to the next one (or the end)
            cut = _next_cut(text, pos + piece_chars + 1, added)
            size = _utf8_size(text, pos, cut, max_pretoken_bytes)
            if size > max_pretoken_bytes:
                raise PretokenTooLong(f"{size:,} bytes without a piece boundary (a space between words); "
                                      f"--max-pretoken-mb allows {max_pretoken_bytes:,}")
            if cut == n:
                break
        out.append(cut)
        pos = cut
    return out


def _utf8_size(text: str, a: int, b: int, limit: int) -> int:
    """The UTF-8 size of text[a:b], counted 1 Mi characters at a time (no copy of a long stretch), or a bound
    on the same side of `limit` when the length in characters decides it (a character is 1-4 bytes)."""
    if b - a > limit:
        return b - a
    if 4 * (b - a) <= limit:
        return 4 * (b - a) if b - a else 0
    size = 0
    for i in range(a, b, PIECE_CHARS):
        size += len(text[i:min(b, i + PIECE_CHARS)].encode("utf-8", "surrogatepass"))
    return size


def encode_in_pieces(encode, text: str, dummy_prefix: bool, piece_chars: int = PIECE_CHARS,
                     max_pretoken_bytes: int = DEFAULT_MAX_PRETOKEN_BYTES, added: tuple = ()) -> np.ndarray:
    """The ids of `text` as int32, encoded piece by piece with `encode(piece) -> ids`; `dummy_prefix`: the
    encoder prepends `▁` itself (SentencePiece's add_dummy_prefix), so later pieces drop their leading space."""
    bounds = [0, *cuts(text, piece_chars, max_pretoken_bytes, added), len(text)]
    parts = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        piece = text[a + 1 if (i and dummy_prefix) else a:b]
        ids = encode(piece)
        parts.append(np.asarray(ids, dtype=np.int32) if isinstance(ids, np.ndarray)
                     else np.fromiter(ids, dtype=np.int32, count=len(ids)))
        del piece, ids
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def dummy_prefix(sp, model_bytes: Optional[bytes]) -> bool:
    if references.format_of(sp) != formats.SENTENCEPIECE or model_bytes is None:
        return False
    from transforms.tokenize import tokenizer_backends as tb  # noqa: PLC0415

    return bool(tb._spec(model_bytes)["add_dummy_prefix"])  # noqa: SLF001
