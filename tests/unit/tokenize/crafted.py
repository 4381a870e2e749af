"""Small tokenizer files written here, each with one defect a test names: a byte-level BPE tokenizer.json (the
256 byte tokens plus the given merges) and a tiktoken file of the 256 single bytes."""
from __future__ import annotations

import base64
import json

from transforms.tokenize.tiktoken_file import _byte_decoder


def byte_level_spec(merges=(), added=(), model=None, vocab=None) -> dict:
    """A GPT-2 style byte-level BPE tokenizer.json as a dict: ids 0-255 the bytes, then one id per merge."""
    decoder = _byte_decoder()
    chars = sorted(decoder, key=decoder.get)
    ids = {c: i for i, c in enumerate(chars)}
    for a, b in merges:
        ids[a + b] = len(ids)
    ids.update(vocab or {})
    spec_model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": ids,
                  "merges": [f"{a} {b}" for a, b in merges]}
    spec_model.update(model or {})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": list(added), "normalizer": None,
            "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level, "model": spec_model}


def added_token(tid: int, content: str, special: bool = True, **flags) -> dict:
    entry = {"id": tid, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": not special, "special": special}
    entry.update(flags)
    return entry


def as_bytes(spec: dict) -> bytes:
    return json.dumps(spec, ensure_ascii=False).encode("utf-8")


def tiktoken_bytes(extra=(), skip=()) -> bytes:
    """A tiktoken file of the 256 single bytes (rank = byte value, but those in `skip`) and `extra` (token, rank)."""
    rows = [(bytes([b]), b) for b in range(256) if b not in skip] + list(extra)
    return "".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in rows).encode("ascii")


def with_apostrophe_s(spec: dict) -> dict:
    """The trained byte-level BPE `spec` with `'s` merged (a split before or after the `'` then changes ids).
    `'s` takes the id after the vocabulary and the added tokens above it move up by one, so the file stays
    consistent (added tokens outside the vocabulary follow it without gaps: transforms/tokenize/file_checks.py)."""
    new_id = max(spec["model"]["vocab"].values()) + 1
    for token in spec["added_tokens"]:
        if token["id"] >= new_id:
            token["id"] += 1
            if token["content"] in spec["model"]["vocab"]:
                spec["model"]["vocab"][token["content"]] = token["id"]
    spec["model"]["vocab"]["'s"] = new_id
    spec["model"]["merges"].append(["'", "s"] if isinstance(spec["model"]["merges"][0], list) else "' s")
    return spec
