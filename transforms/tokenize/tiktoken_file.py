"""A tiktoken BPE file written from an HF byte-level BPE tokenizer.json: the same vocabulary, ranked by id.

tiktoken merges the adjacent pair whose concatenation has the lowest rank; HF's BPE applies its listed merges in
order. A byte-level BPE trained by HF `tokenizers` gives every merged token the id after the previous merge's,
so ranking each token by its id makes the two encoders agree (measured: 0 differing documents on the sample
corpus, tests/unit/tokenize/test_formats.py). Only the BPE model's vocabulary is written: a tiktoken file has no
added tokens; the special ones become `--special-tokens`, the non-special ones (whitespace runs) are not in it,
so the tiktoken file is its own tokenizer (its own sha256), exact against tiktoken, not against the json.
"""
from __future__ import annotations

import base64
import json


def _byte_decoder() -> dict:
    """GPT-2's bytes_to_unicode, inverted: the printable character that stands for each byte in a byte-level
    BPE vocabulary -> that byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def from_tokenizer_json(data: bytes) -> tuple:
    """(tiktoken file bytes, {special token text: id}) of a byte-level BPE tokenizer.json."""
    spec = json.loads(data)
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or (spec.get("pre_tokenizer") or {}).get("type") != "ByteLevel":
        raise ValueError("only a byte-level BPE tokenizer.json (model BPE, pre-tokenizer ByteLevel) converts")
    decoder = _byte_decoder()
    special = {t["content"]: int(t["id"]) for t in spec.get("added_tokens", []) if t.get("special")}
    lines = []
    for token, tid in sorted(model["vocab"].items(), key=lambda item: item[1]):
        if token in special:
            continue
        raw = bytes(decoder[c] for c in token)
        lines.append(base64.b64encode(raw).decode("ascii") + " " + str(tid))
    return ("\n".join(lines) + "\n").encode("ascii"), special


def special_tokens_spec(special: dict) -> str:
    """The `--special-tokens` value for a tiktoken file's special tokens."""
    return ",".join(f"{text}={tid}" for text, tid in sorted(special.items(), key=lambda item: item[1]))
