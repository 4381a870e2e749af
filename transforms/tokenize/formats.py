"""Which tokenizer file a path holds, read from its content: SentencePiece `.model`, HF `tokenizer.json`, tiktoken.

The format decides the reference encoder (that format's own library, transforms/tokenize/references.py) and what
the contract records. Nothing is guessed from a file name: a tokenizer.json is a JSON object with a "model", a
tiktoken file is lines of base64 token + rank, and a SentencePiece model is whatever sentencepiece itself loads.
Anything else is a TokenizerError that names the three formats pileprep accepts.
"""
from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass

from transforms.tokenize import file_checks
from transforms.tokenize.tokenizer_errors import FormatError, TokenizerError  # noqa: F401 - re-exported

SENTENCEPIECE = "sentencepiece"
HF_JSON = "hf-tokenizer-json"
TIKTOKEN = "tiktoken"
FORMATS = (SENTENCEPIECE, HF_JSON, TIKTOKEN)
ACCEPTED = ("a SentencePiece .model, an HF tokenizer.json (or a directory holding one), or a tiktoken BPE file "
            "(base64 token + rank lines, with --tokenizer-pattern)")
# What a document's text may contain: special tokens written in it are ordinary characters in every format and
# backend; the job alone appends the end-of-document id (transforms/shard/packing.py).
SPECIAL_TOKEN_POLICY = "text"

# tiktoken split patterns by name (tiktoken_ext/openai_public.py, transcribed: its functions download the ranks).
PATTERNS = {
    "gpt2": r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
    "cl100k": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
              r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
    "o200k": "|".join([
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+"""]),
}
PATTERNS["r50k"] = PATTERNS["gpt2"]
# Spellings that end a document when a tokenizer has several special tokens and --eos-token is not given.
EOS_SPELLINGS = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")

_TIKTOKEN_LINE = re.compile(rb"[A-Za-z0-9+/]+={0,2} [0-9]+")


@dataclass(frozen=True)
class TokenizerOptions:
    """What a tokenizer file may not carry itself: tiktoken's split pattern and special tokens, and which token
    ends a document when the vocabulary has no single obvious one. Empty = not given."""
    pattern: str = ""  # a PATTERNS name or a regex (tiktoken only)
    special_tokens: str = ""  # tiktoken: 'TEXT=ID,TEXT=ID' or a JSON object {TEXT: ID}
    eos_token: str = ""


def detect(data: bytes) -> str:
    """The format of a tokenizer file's bytes, or FormatError naming the accepted ones."""
    head = data.lstrip()[:1]
    if head == b"{":
        try:
            spec = json.loads(data)
        except ValueError:
            spec = None
        except RecursionError:  # valid JSON nested past the parser's limit (hostile review rv2, F8)
            raise FormatError(file_checks.NESTED_TOO_DEEP) from None
        if isinstance(spec, dict) and isinstance(spec.get("model"), dict):
            return HF_JSON
        raise FormatError(f"a JSON file that is not an HF tokenizer.json (no \"model\" object); --tokenizer takes "
                          f"{ACCEPTED}")
    if data and _looks_tiktoken(data):
        return TIKTOKEN
    if data:
        return SENTENCEPIECE  # confirmed by sentencepiece loading it (transforms/tokenize/tokenizer.py load_processor)
    raise FormatError(f"an empty file; --tokenizer takes {ACCEPTED}")


def _looks_tiktoken(data: bytes) -> bool:
    lines = data[:1 << 16].split(b"\n")[:-1] or [data]
    filled = [line for line in lines[:200] if line.strip()]
    # at least one rank line: a binary file whose first newline comes first has no filled line at all
    return bool(filled) and all(_TIKTOKEN_LINE.fullmatch(line.rstrip(b"\r")) for line in filled)


def check_options_fit(kind: str, options: TokenizerOptions) -> None:
    """--tokenizer-pattern and --special-tokens supply what a tiktoken file does not hold; a tokenizer.json and a
    SentencePiece model carry their own pre-tokenizer and special tokens, and their loaders never read these
    options, so given with them they would be recorded in the manifest and silently have no effect (hostile
    review of issue 28, F9): refused instead."""
    if kind == TIKTOKEN:
        return
    own = {HF_JSON: "its pre_tokenizer and added_tokens", SENTENCEPIECE: "its own pieces and control symbols"}[kind]
    for flag, value in (("--tokenizer-pattern", options.pattern), ("--special-tokens", options.special_tokens)):
        if value:
            raise FormatError(f"{flag} applies to tiktoken files only; this {kind} file carries {own}, so it "
                              f"would have no effect: leave it out")


def tiktoken_ranks(data: bytes) -> dict:
    """{token bytes: rank} of a tiktoken BPE file, parsed as tiktoken.load.load_tiktoken_bpe does (that loader
    reads a path and caches it under /tmp; the job reads the bytes through Beam's FileSystems). A token or rank
    given twice is refused naming both lines: tiktoken panics on a repeated rank, and a repeated token would
    silently keep the last one."""

    ranks: dict = {}
    line_of_token: dict = {}
    line_of_rank: dict = {}
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        if not _TIKTOKEN_LINE.fullmatch(line.strip()):
            raise FormatError(f"line {n} of the tiktoken file is not 'BASE64 RANK'")
        token, rank = line.split()
        try:
            raw = base64.b64decode(token, validate=True)
        except binascii.Error:
            raise FormatError(f"line {n} of the tiktoken file has invalid base64") from None
        rank = file_checks.check_id(int(rank), f"line {n} of the tiktoken file")
        if raw in line_of_token:
            raise FormatError(f"lines {line_of_token[raw]} and {n} of the tiktoken file hold the same token")
        if rank in line_of_rank:
            raise FormatError(f"lines {line_of_rank[rank]} and {n} of the tiktoken file have the same rank {rank}")
        line_of_token[raw] = line_of_rank[rank] = n
        ranks[raw] = rank
    if not ranks:
        raise FormatError("the tiktoken file has no tokens")
    file_checks.check_tiktoken(ranks)
    return ranks


def tiktoken_pattern(value: str) -> str:
    """--tokenizer-pattern NAME|REGEX as the regex (a name of PATTERNS, else the text itself if it compiles)."""
    if not value:
        raise FormatError(f"--tokenizer-pattern is required for a tiktoken file (a name: "
                          f"{', '.join(sorted(PATTERNS))}, or a regex): the file does not carry its split pattern")
    if value in PATTERNS:
        return PATTERNS[value]
    import regex  # noqa: PLC0415 - tiktoken's patterns use \p{..} and possessive quantifiers (not `re`)

    try:
        regex.compile(value)
    except regex.error as e:
        raise FormatError(f"--tokenizer-pattern {value[:40]!r} is neither a name ({', '.join(sorted(PATTERNS))}) "
                          f"nor a valid regex: {e}") from None

    file_checks.check_pattern(value)
    return value


def parse_special_tokens(value) -> dict:
    """--special-tokens 'TEXT=ID,TEXT=ID' or '{"TEXT": ID}' (or a dict, from a contract) as {text: id}. Refused:
    a repeated text, two texts on one id, an id that is not a plain integer, a text padded with whitespace."""

    if isinstance(value, dict):
        out = {str(k): v for k, v in value.items()}
        file_checks.check_special_ids(out)
        return out
    value = value or ""
    if not value.strip():
        return {}
    if value.lstrip().startswith("{"):
        def pairs(items):
            seen = {}
            for k, v in items:
                if k in seen:
                    raise FormatError(f"--special-tokens: {k[:40]!r} is given twice")
                seen[k] = v
            return seen

        try:
            parsed = json.loads(value, object_pairs_hook=pairs)
        except FormatError:
            raise
        except ValueError:
            raise FormatError("--special-tokens: not a JSON object of {TEXT: ID}") from None
        if not isinstance(parsed, dict):
            raise FormatError("--special-tokens: not a JSON object of {TEXT: ID}")
        file_checks.check_special_ids(parsed)
        return parsed
    out = {}
    for item in value.split(","):
        text, sep, tid = item.rpartition("=")
        if not sep or not text or not re.fullmatch(r"[0-9]+", tid):
            raise FormatError(f"--special-tokens: {item.strip()[:40]!r} is not TEXT=ID")
        if text in out:
            raise FormatError(f"--special-tokens: {text[:40]!r} is given twice")
        out[text] = int(tid)
    file_checks.check_special_ids(out)
    return out


def pick_eos(special: dict, eos_token: str, in_vocab) -> tuple:
    """(text, id) of the end-of-document token: --eos-token when given (FormatError when `in_vocab(text)` gives
    None, or an ordinary token: not one of `special`), else the only special token, else the only one spelled as an EOS_SPELLINGS."""
    if eos_token:
        if eos_token != eos_token.strip():
            raise FormatError(f"--eos-token {eos_token[:40]!r} has leading or trailing whitespace")
        if eos_token in special:
            return eos_token, int(special[eos_token])
        tid = in_vocab(eos_token)
        if tid is None:
            raise FormatError(f"--eos-token {eos_token!r} is not in the tokenizer's vocabulary")
        # an ordinary piece (or the unknown token) as EOS: the same id also stands for that text in documents,
        # so a document's end could not be told from its words
        raise FormatError(f"--eos-token {eos_token!r} is an ordinary token of the vocabulary (id {int(tid)}), not "
                          f"a special token; pass one of: {', '.join(sorted(special)[:8]) or 'none'}")
    if len(special) == 1:
        (text, tid), = special.items()
        return text, int(tid)
    named = [t for t in special if t in EOS_SPELLINGS]
    if len(named) == 1:
        return named[0], int(special[named[0]])
    listed = ", ".join(sorted(special)[:8]) or "none"
    raise FormatError(f"the tokenizer has no single obvious end-of-document token (special tokens: {listed}); "
                      f"pass --eos-token TEXT")
