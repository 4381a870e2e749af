"""Loading a tokenizer once per worker and describing it for the contract.

The file is read through Beam's FileSystems (a local, EFS/FSx or s3:// path) so remote workers need no copy
on disk; its format (SentencePiece `.model`, HF tokenizer.json, tiktoken BPE) is detected from the content
(transforms/tokenize/formats.py) and served by that format's own library (transforms/tokenize/references.py).
`describe` gives the contract's TokenizerInfo, including the sha256 that ties shards to the exact file they were
tokenized with, and everything needed to load it again (`options_from_info`).
"""
from __future__ import annotations

import hashlib
import os
from typing import Optional

import numpy as np
import sentencepiece as spm

from model_contract import TokenizerInfo
from transforms.tokenize import formats, long_documents, references
from transforms.tokenize.formats import TokenizerError, TokenizerOptions

__all__ = ["TokenizerError", "TokenizerOptions"]
HF_FILE_NAME = "tokenizer.json"  # what a directory given as --tokenizer must hold


def resolve_path(path: str) -> str:
    """A directory (local, or any path ending in "/") stands for the tokenizer.json inside it."""
    if path.endswith("/") or ("://" not in path and os.path.isdir(path)):
        return path.rstrip("/") + "/" + HF_FILE_NAME
    return path


def read_model_bytes(path: str) -> bytes:
    from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415 - keep this module light to import

    if "://" not in path and os.path.isdir(path) and not os.path.exists(resolve_path(path)):
        raise TokenizerError(f"--tokenizer {path}: a directory without a {HF_FILE_NAME}; --tokenizer takes "
                             f"{formats.ACCEPTED}")
    path = resolve_path(path)
    try:
        with FileSystems.open(path, compression_type="uncompressed") as f:
            return f.read()
    except Exception as e:  # noqa: BLE001 - any failure to read is reported as "cannot read the tokenizer"
        raise TokenizerError(f"--tokenizer: cannot read the tokenizer file at {path}: {e}") from None


def load_processor(model_bytes: bytes, origin: str = "<bytes>", options: Optional[TokenizerOptions] = None):
    """The format's reference encoder for the file's bytes: a SentencePieceProcessor, or an HF / tiktoken
    reference with the same methods (transforms/tokenize/references.py)."""
    options = options or TokenizerOptions()
    try:
        kind = formats.detect(model_bytes)
        if kind == formats.HF_JSON:
            return references.HFReference(model_bytes, options)
        if kind == formats.TIKTOKEN:
            return references.TiktokenReference(model_bytes, options)
    except formats.FormatError as e:
        raise TokenizerError(f"--tokenizer {origin}: {e}") from None
    sp = spm.SentencePieceProcessor()
    try:
        sp.LoadFromSerializedProto(model_bytes)
    except Exception:  # noqa: BLE001 - sentencepiece raises bare RuntimeError/OSError with its internals
        raise TokenizerError(f"--tokenizer {origin}: not a tokenizer file; --tokenizer takes "
                             f"{formats.ACCEPTED}") from None
    if sp.get_piece_size() == 0:
        raise TokenizerError(f"--tokenizer {origin}: a SentencePiece model with an empty vocabulary")
    if options.eos_token and sp.piece_to_id(options.eos_token) in (sp.unk_id(), -1) \
            and options.eos_token != sp.id_to_piece(sp.unk_id()):
        raise TokenizerError(f"--eos-token {options.eos_token!r} is not a piece of the SentencePiece model")
    return sp


def options_of(config) -> TokenizerOptions:
    """The shard config's tokenizer options (--tokenizer-pattern, --special-tokens, --eos-token)."""
    return TokenizerOptions(pattern=getattr(config, "tokenizer_pattern", ""),
                            special_tokens=getattr(config, "special_tokens", ""),
                            eos_token=getattr(config, "eos_token", ""))


def long_document_plan(sp, model_bytes: bytes, config) -> "long_documents.LongDocuments":
    """How a worker encodes long documents: in exact pieces where the format allows (long_documents.py)."""
    mb = getattr(config, "max_pretoken_mb", None)
    limit = int(mb * (1 << 20)) if mb else long_documents.DEFAULT_MAX_PRETOKEN_BYTES
    return long_documents.plan(sp, model_bytes, limit)


def options_from_info(info: TokenizerInfo) -> TokenizerOptions:
    """How to load the tokenizer a contract describes again (inspect, verify, retrieval show, workers)."""
    special = ",".join(f"{t}={i}" for t, i in info.special_tokens.items()) if info.kind == formats.TIKTOKEN else ""
    return TokenizerOptions(pattern=info.pattern, special_tokens=special, eos_token=info.eos_token)


def load_for_info(model_bytes: bytes, info: TokenizerInfo, origin: str = "<bytes>"):
    return load_processor(model_bytes, origin, options_from_info(info))


def describe(sp, model_bytes: bytes, options: Optional[TokenizerOptions] = None) -> TokenizerInfo:
    options = options or TokenizerOptions()
    kind = references.format_of(sp)
    if kind == formats.SENTENCEPIECE and options.eos_token:
        eos, eos_token = sp.piece_to_id(options.eos_token), options.eos_token
    else:
        eos = sp.eos_id()
        eos_token = getattr(sp, "eos_token", "") or (sp.id_to_piece(eos) if eos >= 0 else "")
    if eos < 0:
        raise TokenizerError("--tokenizer: the SentencePiece model has no EOS piece; pileprep ends every document "
                             "with EOS (pass --eos-token TEXT)")
    pad = sp.pad_id()
    return TokenizerInfo(
        kind=kind,
        model_sha256=hashlib.sha256(model_bytes).hexdigest(),
        vocab_size=sp.get_piece_size(),
        bos_id=sp.bos_id(),
        eos_id=eos,
        pad_id=pad if pad >= 0 else 0,
        unk_id=sp.unk_id(),
        eos_token=eos_token,
        special_token_policy=formats.SPECIAL_TOKEN_POLICY,
        special_tokens=references.special_tokens_of(sp),
        pattern=getattr(sp, "pattern", ""),
    )


def token_dtype(vocab_size: int) -> np.dtype:
    """Narrowest unsigned dtype for spilled token ids (2 bytes for vocabularies up to 65,536)."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


TOKEN_ID_DTYPE = np.dtype(np.int32)  # SentencePiece ids are int32 in its own API; 4 bytes, not a Python int's 36
# A fast backend (kitoken, transforms/tokenize/tokenizer_backends.py) needs ~125 bytes of memory per byte of a long run
# without spaces, SentencePiece ~57 (measured on 1 MiB and 16 MiB texts); both give the same ids (the backend is
# parity-checked against SentencePiece), so longer texts go to SentencePiece itself and a document at the
# default --max-line-mb stays within a worker's memory bound.
FAST_BACKEND_MAX_CHARS = 1 << 20


def encode_batch(sp, texts: list, long_docs: Optional["long_documents.LongDocuments"] = None) -> list:
    """Token ids of each text as an int32 array, exactly `sp.encode(text)`; one thread, because Beam workers are
    the parallelism. `sp` is a format's reference encoder or a fast backend with the same `encode` and a
    `reference`, which encodes the texts above FAST_BACKEND_MAX_CHARS. Each Python list is swapped for its array
    as soon as it is converted, so the lists of a batch are not all alive beside their arrays.

    With `long_docs` exact (transforms/tokenize/long_documents.py), a text above its piece size is encoded in
    pieces by `sp` itself, the same ids in memory bounded by the piece; None stands for a text with a stretch
    longer than --max-pretoken-mb without a piece boundary (the caller dead-letters it, `pretoken_too_long`)."""
    if long_docs is not None and long_docs.exact and any(len(t) > long_docs.piece_chars for t in texts):
        out: list = [None] * len(texts)
        short = [i for i, t in enumerate(texts) if len(t) <= long_docs.piece_chars]
        for i, ids in zip(short, encode_batch(sp, [texts[i] for i in short])):
            out[i] = ids
        for i, text in enumerate(texts):
            if len(text) > long_docs.piece_chars:
                try:
                    out[i] = long_documents.encode_in_pieces(
                        lambda piece: sp.encode([piece], out_type=int, num_threads=1)[0], text,
                        long_docs.dummy_prefix, long_docs.piece_chars, long_docs.max_pretoken_bytes)
                except long_documents.PretokenTooLong:
                    out[i] = None
        return out
    reference = getattr(sp, "reference", None)
    if reference is not None and any(len(t) > FAST_BACKEND_MAX_CHARS for t in texts):
        encoded = [(reference if len(t) > FAST_BACKEND_MAX_CHARS else sp).encode([t], out_type=int, num_threads=1)[0]
                   for t in texts]
    else:
        encoded = sp.encode(texts, out_type=int, num_threads=1)
    for i, ids in enumerate(encoded):  # fromiter: ~30 ns per id against np.array's ~43 (measured)
        encoded[i] = (np.asarray(ids, dtype=TOKEN_ID_DTYPE) if isinstance(ids, np.ndarray)
                      else np.fromiter(ids, dtype=TOKEN_ID_DTYPE, count=len(ids)))
    return encoded
