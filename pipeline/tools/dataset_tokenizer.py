"""The tokenizer a committed dataset's tokens decode with: the file only when it is the one the contract names.

Shared by `pileprep report` and `pileprep inspect`; kept apart from both so that neither imports the other for
it (that closed a cycle: tools/inspect_dataset -> tools/report -> tools/inspect_dataset).
"""
from __future__ import annotations

import hashlib


def contract_tokenizer(path, info) -> tuple:
    """(the tokenizer at `path`, "") when the file has the contract's sha256, else (None, a one-line note: token
    ids are shown instead). Decoding with another file would show text the data does not hold; the report
    (pipeline/tools/report.py) and `pileprep inspect` (pipeline/tools/inspect_dataset.py) both decode only
    through this check."""
    from transforms.tokenize import tokenizer  # noqa: PLC0415

    try:
        # a directory stands for its tokenizer.json, and the contract holds the options the file does not carry
        # (a tiktoken file's pattern and special tokens, --eos-token): as inspect and verify load it
        model = tokenizer.read_model_bytes(path) if isinstance(path, str) and path else None
        if model is None:
            return None, "token ids: no tokenizer file recorded or given"
        got = hashlib.sha256(model).hexdigest()
        if got != info.model_sha256:
            return None, (f"token ids: the tokenizer file's sha256 {got[:12]}… is not the contract's "
                          f"{str(info.model_sha256)[:12]}… (changed since the run, or another tokenizer)")
        return tokenizer.load_for_info(model, info, path), ""
    except (OSError, ValueError, RuntimeError) as e:
        return None, f"token ids: the tokenizer file cannot be read ({type(e).__name__})"
