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
import stat
from dataclasses import dataclass
from typing import Optional

import numpy as np
import sentencepiece as spm

from model_contract import TokenizerInfo
from transforms.tokenize import file_checks, formats, long_documents, native, references
from transforms.tokenize.formats import TokenizerError, TokenizerOptions

__all__ = ["TokenizerError", "TokenizerOptions"]
HF_FILE_NAME = "tokenizer.json"  # what a directory given as --tokenizer must hold


def resolve_path(path: str) -> str:
    """A directory (local, or any path ending in "/") stands for the tokenizer.json inside it."""
    if path.endswith("/") or ("://" not in path and os.path.isdir(path)):
        return path.rstrip("/") + "/" + HF_FILE_NAME
    return path


def read_model_bytes(path: str) -> bytes:
    """The tokenizer file's bytes, read as inputs are (pipeline/ops/input_checks.py): a regular file (or object)
    of at most file_checks.MAX_TOKENIZER_BYTES, else TokenizerError. The one opener of a tokenizer path: the shard
    job, `inspect`, `verify` and the report read --tokenizer and a manifest's tokenizer through it, so a FIFO
    cannot block them and /dev/zero cannot be read until memory runs out."""
    if "://" not in path and os.path.isdir(path) and not os.path.exists(resolve_path(path)):
        raise TokenizerError(f"--tokenizer {path}: a directory without a {HF_FILE_NAME}; --tokenizer takes "
                             f"{formats.ACCEPTED}")
    path = resolve_path(path)
    limit = file_checks.MAX_TOKENIZER_BYTES
    if "://" not in path:
        return _read_local(path, limit)
    from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415 - keep this module light to import

    try:
        size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
        if size > limit:
            raise TokenizerError(f"--tokenizer {path}: {size:,} bytes, over the {limit:,} a tokenizer file may have")
        with FileSystems.open(path, compression_type="uncompressed") as f:
            data = f.read(limit + 1)
    except TokenizerError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure to read is reported as "cannot read the tokenizer"
        raise TokenizerError(f"--tokenizer: cannot read the tokenizer file at {path}: {_one_line(e)}") from None
    if len(data) > limit:
        raise TokenizerError(f"--tokenizer {path}: over the {limit:,} bytes a tokenizer file may have")
    return data


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]


def _read_local(path: str, limit: int) -> bytes:
    """A local tokenizer file: opened without blocking (a FIFO would wait for a writer), then checked to be a
    regular file of at most `limit` bytes on the open descriptor itself, and read no further than the bound."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise TokenizerError(f"--tokenizer: cannot read the tokenizer file at {path}: "
                             f"{e.strerror or _one_line(e)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TokenizerError(f"--tokenizer {path}: not a regular file (a device, FIFO or socket); --tokenizer "
                                 f"takes {formats.ACCEPTED}")
        if st.st_size > limit:
            raise TokenizerError(f"--tokenizer {path}: {st.st_size:,} bytes, over the {limit:,} a tokenizer file "
                                 f"may have")
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while total <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as e:
        raise TokenizerError(f"--tokenizer: cannot read the tokenizer file at {path}: "
                             f"{e.strerror or _one_line(e)}") from None
    finally:
        os.close(fd)
    if total > limit:  # it grew while being read
        raise TokenizerError(f"--tokenizer {path}: over the {limit:,} bytes a tokenizer file may have")
    return b"".join(chunks)


def load_processor(model_bytes: bytes, origin: str = "<bytes>", options: Optional[TokenizerOptions] = None):
    """The format's reference encoder for the file's bytes: a SentencePieceProcessor, or an HF / tiktoken
    reference with the same methods (transforms/tokenize/references.py)."""
    options = options or TokenizerOptions()
    try:
        kind = formats.detect(model_bytes)
        if kind == formats.HF_JSON:
            formats.check_options_fit(kind, options)
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
    try:
        formats.check_options_fit(formats.SENTENCEPIECE, options)  # once sentencepiece took it: it is one
    except formats.FormatError as e:
        raise TokenizerError(f"--tokenizer {origin}: {e}") from None
    if options.eos_token:
        tid = sp.piece_to_id(options.eos_token)
        if tid in (sp.unk_id(), -1) and options.eos_token != sp.id_to_piece(sp.unk_id()):
            raise TokenizerError(f"--eos-token {options.eos_token!r} is not a piece of the SentencePiece model")
        if not sp.is_control(tid):  # an ordinary piece or <unk>: the same id stands for text in documents
            raise TokenizerError(f"--eos-token {options.eos_token!r} is not a control piece of the SentencePiece "
                                 f"model (id {tid} is {'the unknown piece' if sp.is_unknown(tid) else 'ordinary'})")
    return sp


def options_of(config) -> TokenizerOptions:
    """The shard config's tokenizer options (--tokenizer-pattern, --special-tokens, --eos-token)."""
    return TokenizerOptions(pattern=getattr(config, "tokenizer_pattern", ""),
                            special_tokens=getattr(config, "special_tokens", ""),
                            eos_token=getattr(config, "eos_token", None) or "")  # None: not given


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


@dataclass(frozen=True)
class Rejected:
    """In place of a document's ids: why it was not encoded (the dead-letter reason) and what the library said."""
    reason: str
    detail: str = ""


def encode_batch(sp, texts: list, long_docs: Optional["long_documents.LongDocuments"] = None) -> list:
    """Token ids of each text as an int32 array, exactly `sp.encode(text)`; one thread, because Beam workers are
    the parallelism. `sp` is a format's reference encoder or a fast backend with the same `encode` and a
    `reference`, which encodes the texts above FAST_BACKEND_MAX_CHARS. Each Python list is swapped for its array
    as soon as it is converted, so the lists of a batch are not all alive beside their arrays.

    With `long_docs` exact (transforms/tokenize/long_documents.py), a text above its piece size is encoded in
    pieces by `sp` itself, the same ids in memory bounded by the piece. A text that cannot be encoded gets a
    Rejected in place of its ids, for the caller to dead-letter with its file and line: `pretoken_too_long` (a
    stretch longer than --max-pretoken-mb without a piece boundary), `tokenizer_panic` (the library panicked on
    it, e.g. a split regex over its backtrack limit; a fast backend's panic is retried on the reference first),
    `tokenizer_drops_text` (ids that do not hold all of the text: a tiktoken pattern that leaves part of it
    unmatched, references.TiktokenReference.lost_text)."""
    encoded = _encode_batch(sp, texts, long_docs)
    lost_text = getattr(getattr(sp, "reference", sp), "lost_text", None)
    if lost_text is not None:
        for i, ids in enumerate(encoded):
            detail = "" if isinstance(ids, Rejected) else lost_text(texts[i], ids)
            if detail:
                encoded[i] = Rejected(references.TOKENIZER_DROPS_TEXT, detail)
    return encoded


def _encode_batch(sp, texts: list, long_docs: Optional["long_documents.LongDocuments"] = None) -> list:
    if long_docs is not None and long_docs.exact and any(len(t) > long_docs.piece_chars for t in texts):
        out: list = [None] * len(texts)
        short = [i for i, t in enumerate(texts) if len(t) <= long_docs.piece_chars]
        for i, ids in zip(short, _encode_batch(sp, [texts[i] for i in short])):
            out[i] = ids
        for i, text in enumerate(texts):
            if len(text) > long_docs.piece_chars:
                out[i] = _encode_long(sp, text, long_docs)
        return out
    reference = getattr(sp, "reference", None)
    if reference is not None and any(len(t) > FAST_BACKEND_MAX_CHARS for t in texts):
        encoded = [_encode_one(reference if len(t) > FAST_BACKEND_MAX_CHARS else sp, t) for t in texts]
    else:
        encoded = _encode_all(sp, texts)
    for i, ids in enumerate(encoded):  # fromiter: ~30 ns per id against np.array's ~43 (measured)
        if isinstance(ids, Rejected):
            continue
        encoded[i] = (np.asarray(ids, dtype=TOKEN_ID_DTYPE) if isinstance(ids, np.ndarray)
                      else np.fromiter(ids, dtype=TOKEN_ID_DTYPE, count=len(ids)))
    return encoded


def _encode_all(sp, texts: list) -> list:
    """One batch call; when the library panics on one of the texts, each text alone (native.py)."""
    try:
        return sp.encode(texts, out_type=int, num_threads=1)
    except BaseException as e:
        if not native.is_panic(e):
            raise
    return [_encode_one(sp, t) for t in texts]


def _encode_one(encoder, text: str):
    """`encoder.encode(text)`, or on a panic the reference's ids (a fast backend's), or Rejected."""
    try:
        return encoder.encode([text], out_type=int, num_threads=1)[0]
    except BaseException as e:
        if not native.is_panic(e):
            raise
        reference = getattr(encoder, "reference", None)
        if reference is not None and reference is not encoder:
            return _encode_one(reference, text)
        return Rejected(native.TOKENIZER_PANIC, native.describe(e))


def _encode_long(sp, text: str, long_docs: "long_documents.LongDocuments"):
    """A long text in pieces (long_documents.encode_in_pieces) with `sp`, its reference on a panic, or Rejected;
    a spot-checked fast backend counts it as one document (spot_check.SpotChecked.count_as_one), not per piece."""
    counts = getattr(sp, "counts", None)
    before = dict(counts) if counts is not None else None
    out = _encode_pieces(sp, text, long_docs)
    if before is not None:
        sp.count_as_one(text, before, not isinstance(out, Rejected))
    return out


def _encode_pieces(sp, text: str, long_docs: "long_documents.LongDocuments"):
    encoder = sp
    while True:
        try:
            return long_documents.encode_in_pieces(
                lambda piece: encoder.encode([piece], out_type=int, num_threads=1)[0], text,
                long_docs.dummy_prefix, long_docs.piece_chars, long_docs.max_pretoken_bytes, long_docs.added)
        except long_documents.PretokenTooLong:  # no detail: the rows stay as they were before panics had one
            return Rejected(long_documents.PRETOKEN_TOO_LONG)
        except BaseException as e:
            if not native.is_panic(e):
                raise
            reference = getattr(encoder, "reference", None)
            if reference is None or reference is encoder:
                return Rejected(native.TOKENIZER_PANIC, native.describe(e))
            encoder = reference
