"""Exact fast tokenizer backends: a faster encoder is used only where it provably gives the reference's ids.

The reference is the tokenizer format's own library (transforms/tokenize/references.py): sentencepiece for a
`.model`, HF `tokenizers` for a tokenizer.json, tiktoken for a tiktoken file. gigatoken (Rust, the bounded-cache
fork `gigatoken-cachefix`) encodes SentencePiece BPE byte-fallback models and HF byte-level BPE ~30x and ~50x
faster than their references on one thread (bench/tokenizer_backend_bench.py); it is given the tokenizer.json
(for a `.model`, gigatoken's own conversion of it) minus its `special: true` added tokens, so a document that
spells `<s>` or `<|endoftext|>` gets the text's ids, as from the reference, and its encode cache is bounded
explicitly (GIGATOKEN_CACHE_BYTES). `auto` considers gigatoken only (FAST_BACKENDS says why).

For SentencePiece models, when asked for by name, kitoken (Rust) reads the same SentencePiece model file and,
with special-token parsing off, gives ids identical to `sp.encode` on the BPE models tested at about a third of the CPU;
splintr-rs (Rust; its BPE over a tokenizer.json built here from the model's pieces and scores) is exact too on
the BPE models it accepts, as fast on one thread and faster from two threads of one process (its call releases
the GIL). Trust is earned, not assumed, in steps:
1. the model: unigram models stay on SentencePiece (its float score ties resolve differently elsewhere), and a
   backend refuses a model whose normalizer or pieces it does not reproduce (`splintr_unsupported`);
2. at the driver, a seeded ~1 MB sample of the run's own documents must match SentencePiece id for id, or
   the run falls back to SentencePiece with the reason logged and recorded in the manifest;
3. on the workers, a seeded 1-in-N spot check re-encodes documents with the reference; one mismatch fails the
   run (`BackendMismatchError`) rather than write different tokens. N grows with the backend's speed-up over its
   reference (SPOT_CHECK_EVERY) so the check costs <= 5% of the tokenize stage, and the manifest records the share
   of documents and bytes it re-encoded.
Before all of these, routing by construction (transforms/tokenize/exact_domain.py): a document goes to the fast
backend only when every character of it lies in the domain proven equal for this (backend, tokenizer file) by
comparing both libraries on every code point and added-token text; the rest goes to the reference, counted per
backend in the manifest (`documents_by_backend`). The sample and spot checks are a second line.
The backend never changes the shards (byte-identical, tested) and is not part of the dataset's fingerprint; it
is part of every unit's resume key (`BackendChoice.resume_key`, pipeline/shard/resume.py), and a backend that
failed a spot check is recorded in the staging so no later run reuses its units or picks it again. The manifest
records which backend ran, its domain, parity sample and per-backend counts: the only fields that may differ.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
import os
import struct
import threading
import zlib
from dataclasses import asdict, dataclass, field
from typing import Optional

from transforms.tokenize import exact_domain, formats, references, tokenizer_cache
from transforms.tokenize.sentencepiece_model import (  # noqa: F401 - re-exported: the package's proto reader
    _PIECE_TYPES, _spec, model_pieces, model_type)

LOG = logging.getLogger("pileprep.tokenizer")
BACKENDS = ("auto", "reference", "sentencepiece", "gigatoken", "kitoken", "splintr")
# What `auto` may choose: gigatoken only (~32x sp.encode per thread on Llama 2, bench/tokenizer_backend_bench.py;
# the only fast backend that reads an HF tokenizer.json). splintr and kitoken stay selectable by name but are not
# candidates of `auto`: kitoken breaks SentencePiece's score ties by piece id instead of the leftmost pair
# (tests/fixtures/sp_models.py LLAMA_WHITESPACE_ORDER), and the exact domain (transforms/tokenize/exact_domain.py)
# compares single code points, so a tie inside a multi-character run is outside what it proves; with one
# candidate, `auto`'s exactness rests on the domain plus gigatoken's tie tests, not on a sampled parity check.
FAST_BACKENDS = {formats.SENTENCEPIECE: ("gigatoken",), formats.HF_JSON: ("gigatoken",), formats.TIKTOKEN: ()}
REFERENCE_NAMES = {formats.SENTENCEPIECE: "sentencepiece", formats.HF_JSON: "tokenizers", formats.TIKTOKEN: "tiktoken"}
# Spot check 1 document in N: the check re-encodes ~1/N of the bytes with the reference, which is `speed-up` times
# slower than the backend, so its cost is ~speed-up/N of the encode; N >= 20 x the measured speed-up keeps it
# <= 5% of the tokenize stage (which is more than the encode: parsing, ids, spill). Measured again with the
# bench's 4,938 documents (12 alternating runs, load ~3.9): the check's whole cost, picking and re-encoding, was
# +9.6% (Llama 2) and +7.3% (HF byte-level BPE) of gigatoken's encode CPU, ~0.01 CPU-s per 9.8 MB of text,
# i.e. ~0.5% of the split + tokenize stage's 5.0 CPU-s on 24 MB (docs/BENCHMARKS.md). Speed-ups per thread
# (bench/tokenizer_backend_bench.py, same run, CPU): gigatoken 23-32x sentencepiece on Llama 2 (1 in 1024:
# 2.3-3.1%) and 58-73x HF tokenizers on a trained byte-level BPE (1 in 2048: 2.8-3.6%); splintr 4.6-8.5x (1 in
# 256: <= 3.3%), kitoken 3.1-3.6x (1 in 128: <= 2.8%).
SPOT_CHECK_EVERY = {("gigatoken", formats.SENTENCEPIECE): 1024, ("gigatoken", formats.HF_JSON): 2048,
                    ("splintr", formats.SENTENCEPIECE): 256, ("kitoken", formats.SENTENCEPIECE): 128}
# The driver's parity sample: the run's documents checked against the reference before any worker starts. The
# reference encodes it on one thread while both cores wait, so it is start-up cost (docs/DESIGN.md: at most 1 MB;
# 4 MiB took 7.3 of the driver's 10.1 s of planning on a 24 MB input under cProfile, docs/BENCHMARKS.md); the
# workers' spot checks cover the rest of the run.
PARITY_SAMPLE_BYTES = 1 << 20
GIGATOKEN_CACHE_BYTES = 64 << 20  # per encoder; gigatoken's default is 512 MiB (tests/e2e/test_memory_bounds.py)

class BackendMismatchError(RuntimeError):
    """A fast backend produced ids that differ from SentencePiece's: the run stops, nothing is written."""


@dataclass(frozen=True)
class BackendChoice:
    """What the driver decided; goes into the plan (workers build the same encoder) and the manifest."""
    name: str  # the backend that runs: a reference ("sentencepiece", "tokenizers", "tiktoken") or a fast one
    requested: str
    reason: str
    version: str = ""
    parity_documents: int = 0
    parity_tokens: int = 0
    parity_ids_sha256: str = ""
    spot_check_every: int = 0
    # The fast backend's proven-equal domain (transforms/tokenize/exact_domain.py Domain.to_json) and its digest;
    # the workers route by it, and the digest and versions are in the units' resume key (`resume_key`).
    domain_json: str = ""
    domain_sha256: str = ""
    reference_version: str = ""
    reference_format: str = ""

    @property
    def resume_key(self) -> str:
        """Everything about the backend that decides a unit's bytes: the backend and its reference with their
        versions and, for a fast one, the digest of the domain it was given (pipeline/shard/resume.py)."""
        return f"{self.name}={self.version}|reference={self.reference_version}|domain={self.domain_sha256}"

    def to_manifest(self, spot_checked: Optional[dict] = None) -> dict:
        """The choice, and with `spot_checked` ({documents, bytes, checked_documents, checked_bytes,
        fast_/reference_ documents and bytes} summed over the run's units) the share of documents and bytes the
        workers re-encoded with the reference, and how many documents and bytes each backend tokenized
        (`documents_by_backend`; they add up to `documents` and `bytes`)."""
        out = asdict(self)
        del out["domain_json"]
        if self.domain_json:
            domain = exact_domain.Domain.from_json(self.domain_json)
            out["domain"] = {"sha256": self.domain_sha256, "compared": domain.compared,
                             "excluded_code_points": domain.excluded_code_points,
                             "excluded_ranges": len(domain.excluded_ranges),
                             "excluded_texts": len(domain.excluded_texts)}
        if spot_checked is not None and self.domain_json:
            reference = REFERENCE_NAMES.get(self.reference_format, "reference")
            out["documents_by_backend"] = {
                self.name: {"documents": spot_checked.get("fast_documents", 0),
                            "bytes": spot_checked.get("fast_bytes", 0)},
                reference: {"documents": spot_checked.get("reference_documents", 0),
                            "bytes": spot_checked.get("reference_bytes", 0)}}
        if spot_checked is not None and self.spot_check_every:
            docs, size = spot_checked.get("documents", 0), spot_checked.get("bytes", 0)
            out["spot_checked"] = {**spot_checked,
                                   "document_share": round(spot_checked.get("checked_documents", 0) / docs, 6)
                                   if docs else 0.0,
                                   "byte_share": round(spot_checked.get("checked_bytes", 0) / size, 6) if size else 0.0}
        return out


def splintr_unsupported(model_bytes: bytes) -> str:
    """Why splintr (over `splintr_tokenizer_json`) cannot reproduce this model's `sp.encode`, or "" when it can.
    That tokenizer has no normalizer but the dummy `▁` prefix and spaces as `▁`, keeps repeated whitespace, falls
    back to `<0xNN>` byte pieces and merges into normal pieces only: so the model must have the identity
    normalizer (no charsmap), those whitespace flags, byte fallback, and no user-defined pieces (SentencePiece
    matches them whole) or unused ones."""
    spec = _spec(model_bytes)
    wanted = {"add_dummy_prefix": 1, "remove_extra_whitespaces": 0, "escape_whitespaces": 1, "byte_fallback": 1,
              "treat_whitespace_as_suffix": 0}
    if spec["charsmap"]:
        return f"splintr has no normalizer; the model normalizes with {spec['normalizer']!r}"
    for name, value in wanted.items():
        if spec[name] != value:
            return f"splintr needs {name}={bool(value)}; the model has {bool(spec[name])}"
    kinds = {_PIECE_TYPES.get(k, str(k)) for _p, _s, k in model_pieces(model_bytes)}
    odd = sorted(kinds - {"normal", "unknown", "control", "byte"})
    if odd:
        return f"splintr would merge into the model's {'/'.join(odd)} pieces"
    return ""


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _as_list(ids) -> list:
    """Ids as a list of Python ints, whether a backend returned a list or an array."""
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)


SPOT_KEY_CHARS = 256


def utf8_size(text: str) -> int:
    """len(text.encode("utf-8")) without the copy for ASCII text (str.isascii reads a flag of the string)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def spot_check_key(text: str) -> int:
    """What picks the spot-checked documents: a CRC-32 of the text's first SPOT_KEY_CHARS characters seeded with
    its length, so the same documents are picked on any worker or bundle. Not of the whole text: beside
    gigatoken, a UTF-8 copy and CRC of every document cost more than the re-encodes they pick (measured on the
    1,226 documents of ../shared/data and an 8 MB sample corpus, CPU of the bookkeeping alone against gigatoken's
    encode: 3.8% -> 0.9% with Llama 2, 5.3% -> 1.4% with an HF byte-level BPE). bench/tokenizer_backend_bench.py
    times the job's call with and without the check."""
    return zlib.crc32(text[:SPOT_KEY_CHARS].encode("utf-8", "surrogatepass"), len(text) & 0xFFFFFFFF)


FAULT_ENV = "PILEPREP_TEST_BACKEND_FAULT"


class _SpotChecked:
    """SentencePiece-compatible `encode(texts, out_type=int, num_threads=1)` on a fast backend, spot-checked.

    Every `spot_check_every`-th document (by `spot_check_key` of its text: the same documents whatever the
    worker or bundle) is re-encoded with the reference and compared; a mismatch raises BackendMismatchError.
    `reference` is the format's reference encoder: transforms.tokenize.tokenizer.encode_batch sends very long
    texts that cannot be cut into exact pieces to it (the fast backends' memory per byte is higher). `counts`
    holds documents and bytes seen and spot-checked."""
    name = ""

    def __init__(self, sp, spot_check_every: int):
        self._sp = sp
        self.reference = _CountedReference(sp, self)
        self.spot_check_every = spot_check_every
        self.spot_checked = 0
        self.router = None  # exact_domain.Router: set by make_encoder / the parity check (`route`)
        # Test-only (tests/e2e/test_backend_routing.py): with $PILEPREP_TEST_BACKEND_FAULT=TEXT a worker's encoder
        # (spot checks on) returns wrong ids for every document, as a broken backend would, and spot-checks the
        # documents containing TEXT, so a run fails after some units are finished.
        self.fault = os.environ.get(FAULT_ENV, "") if spot_check_every else ""
        self.counts = {"documents": 0, "bytes": 0, "checked_documents": 0, "checked_bytes": 0,
                       "fast_documents": 0, "fast_bytes": 0, "reference_documents": 0, "reference_bytes": 0}

    def route(self, domain) -> "_SpotChecked":
        """Send only documents inside `domain` (transforms/tokenize/exact_domain.py) to the fast backend."""
        self.router = domain.router()
        return self

    def _encode_all(self, batch: list) -> list:
        raise NotImplementedError

    def _count_reference(self, size: int) -> None:
        counts = self.counts
        counts["documents"] += 1
        counts["bytes"] += size
        counts["reference_documents"] += 1
        counts["reference_bytes"] += size

    def encode(self, texts, out_type=int, num_threads=1):  # noqa: ARG002 - SentencePiece's signature
        single = isinstance(texts, str)
        batch = [texts] if single else list(texts)
        router = self.router  # None only for an encoder built directly (the tests' and bench's raw comparisons)
        fast = list(range(len(batch))) if router is None else [i for i, t in enumerate(batch) if router.admits(t)]
        ids: list = [None] * len(batch)
        for i, got in zip(fast, self._encode_all([batch[i] for i in fast])):
            ids[i] = [x + 1 for x in _as_list(got)] if self.fault else got
        counts = self.counts
        every = self.spot_check_every
        fault = self.fault
        size_all = checked = checked_size = 0
        crc = zlib.crc32
        for i in fast:  # utf8_size and spot_check_key inlined: ~25% less per document
            text = batch[i]
            size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
            size_all += size
            if not every or crc(text[:SPOT_KEY_CHARS].encode("utf-8", "surrogatepass"), len(text) & 0xFFFFFFFF) % every:
                if not (fault and fault in text):
                    continue
            checked += 1
            checked_size += size
            want = _as_list(self._sp.encode(text, out_type=int))
            if want != _as_list(ids[i]):
                raise BackendMismatchError(
                    f"{self.name} and {REFERENCE_NAMES[references.format_of(self._sp)]} disagree on a "
                    f"{len(text)}-character document (first ids {_as_list(ids[i][:8])} vs {want[:8]}); rerun "
                    f"with --tokenizer-backend reference")
        if len(fast) < len(batch):  # outside the proven domain: the reference's ids, counted as its documents
            for i, text in enumerate(batch):
                if ids[i] is None:
                    ids[i] = self._sp.encode(text, out_type=int)
                    self._count_reference(utf8_size(text))
        self.spot_checked += checked
        counts["documents"] += len(fast)
        counts["bytes"] += size_all
        counts["fast_documents"] += len(fast)
        counts["fast_bytes"] += size_all
        counts["checked_documents"] += checked
        counts["checked_bytes"] += checked_size
        return ids[0] if single else ids


class _CountedReference:
    """The reference as a fast encoder's `reference` (the very long texts transforms/tokenize/tokenizer.py sends
    to it directly): the same encoder, its documents counted as the reference's in the owner's `counts`."""

    def __init__(self, sp, owner: "_SpotChecked"):
        self._sp = sp
        self._owner = owner

    def __getattr__(self, name):
        return getattr(self._sp, name)

    def encode(self, texts, out_type=int, num_threads=1):
        single = isinstance(texts, str)
        for text in [texts] if single else texts:
            self._owner._count_reference(utf8_size(text))  # noqa: SLF001 - the owner's counters
        return self._sp.encode(texts, out_type=out_type, num_threads=num_threads)


class KitokenEncoder(_SpotChecked):
    """kitoken reads the SentencePiece model file itself. Special-token parsing is off: SentencePiece's `encode`
    treats `<s>` in text as plain characters, and so must we."""
    name = "kitoken"

    def __init__(self, model_bytes: bytes, sp, spot_check_every: int = SPOT_CHECK_EVERY):
        import kitoken  # noqa: PLC0415 - optional dependency, imported only when chosen

        super().__init__(sp, spot_check_every)
        self._kt = kitoken.Kitoken.from_sentencepiece(model_bytes)

    def _encode_all(self, batch: list) -> list:
        return [self._kt.encode(t, False) for t in batch]


def splintr_tokenizer_json(model_bytes: bytes) -> bytes:
    """A HuggingFace `tokenizer.json` that is the SentencePiece BPE model, for splintr's fast BPE (its byte-level
    family: chunk cache, cuts between words where the vocabulary proves them free, flat id buffers).

    SentencePiece's BPE merges, again and again, the adjacent pair whose concatenation is a normal piece with
    the highest score, leftmost first; HF BPE merges the listed pair of lowest rank. So the merges are every
    split of every normal piece into two normal pieces, ranked by the merged piece's score (highest first, then
    id, then the left part's id: ties in score occur only among whitespace-only pieces and between the splits
    of one piece). The normalizer is SentencePiece's for an identity-normalized model: the dummy `▁` prefix, then
    spaces as `▁`. No added tokens: `<s>` in the text stays characters, as in `sp.encode`. Byte fallback to the
    `<0xNN>` pieces. Exactness is measured, not assumed (parity at the driver, spot checks on the workers)."""
    import json  # noqa: PLC0415 - only when splintr is chosen

    pieces = model_pieces(model_bytes)
    ids = {p: i for i, (p, _s, _k) in enumerate(pieces)}
    normal = {p for p, _s, k in pieces if k == 1}
    merges = []
    for i, (piece, score, kind) in enumerate(pieces):
        if kind != 1:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                merges.append((-score, i, ids[left], left, right))
    merges.sort()
    unk = next((p for p, _s, k in pieces if k == 2), "<unk>")
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None, "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": ids, "merges": [[left, right] for *_rank, left, right in merges]},
    }
    return json.dumps(spec, ensure_ascii=False).encode("utf-8")


@functools.lru_cache(maxsize=2)
def _splintr_tokenizer(model_bytes: bytes):
    """One splintr tokenizer per model and process: building it takes ~0.4 s (the tokenizer.json of a 32k model),
    and with in-process workers (FnApiRunner multi_threading) the driver's parity check and every worker thread
    would each build their own. One object serves several threads exactly (tested)."""
    import splintr  # noqa: PLC0415 - optional dependency, imported only when chosen

    return splintr.from_json_bytes(splintr_tokenizer_json(model_bytes))


class SplintrEncoder(_SpotChecked):
    """splintr-rs's BPE over `splintr_tokenizer_json(model)`; refused (ValueError) for a model whose encode it does
    not reproduce (`splintr_unsupported`). splintr's own SentencePiece class (`SpmTokenizer`) is exact too but
    no faster than SentencePiece, and holds the GIL for a whole document; this one is ~3x SentencePiece on one
    thread (as kitoken) and ~7x from two Python threads (kitoken ~4.6x) on Llama 2 (bench/tokenizer_backend_bench.py).

    Each document is its own `encode_batch_flat([text])` call: that call releases the GIL (so Beam's worker
    threads in one process tokenize in parallel; `encode`/`encode_flat` hold it), does one document's work on
    one thread (Beam's workers are the parallelism), and returns the ids as one little-endian uint32 buffer,
    read here as an int32 array without a Python int per token (ids < 2**31). The empty text is SentencePiece's
    `[]` (the HF normalizer would prepend `▁` to it)."""
    name = "splintr"

    def __init__(self, model_bytes: bytes, sp, spot_check_every: int = SPOT_CHECK_EVERY):
        problem = splintr_unsupported(model_bytes)
        if problem:
            raise ValueError(problem)
        super().__init__(sp, spot_check_every)
        self._tok = _splintr_tokenizer(model_bytes)
        if self._tok.family != "BPE":
            raise ValueError(f"splintr loaded the model as {self._tok.family!r}, not its BPE")

    def _encode_all(self, batch: list) -> list:
        import numpy as np  # noqa: PLC0415 - the job's own dependency; local like the backend's import

        empty = np.zeros(0, dtype=np.int32)
        return [np.frombuffer(self._tok.encode_batch_flat([t])[0], dtype="<i4") if t else empty for t in batch]


def gigatoken_tokenizer_json(model_bytes: bytes, kind: str) -> str:
    """The tokenizer.json gigatoken is given: the file itself (HF) or gigatoken's conversion of the `.model`, minus
    its `special: true` added tokens. With them, gigatoken matches `<s>` written in a document as the control id
    (3 of 8,350 mini-Pile documents with Llama 2); non-special added tokens (SentencePiece user-defined pieces,
    HF whitespace runs) are vocabulary that the reference matches too, so they stay."""
    import json  # noqa: PLC0415 - only when gigatoken is chosen

    if kind == formats.SENTENCEPIECE:
        from gigatoken._load.sentencepiece import sentencepiece_to_tokenizer_json  # noqa: PLC0415

        spec = json.loads(sentencepiece_to_tokenizer_json(model_bytes))
    else:
        spec = json.loads(model_bytes)
    spec["added_tokens"] = [t for t in spec.get("added_tokens") or [] if not t.get("special")]
    return json.dumps(spec, ensure_ascii=False)


# The tokenizer.json given to gigatoken is kept between processes (transforms/tokenize/tokenizer_cache.py): a
# `.model`'s conversion (`sentencepiece_to_tokenizer_json`) and the JSON round trip of `gigatoken_tokenizer_json`
# cost ~0.4 CPU-s of a 32k model in every process that builds the encoder (docs/BENCHMARKS.md). "off" disables it.
TOKENIZER_CACHE_ENV = tokenizer_cache.TOKENIZER_CACHE_ENV
tokenizer_cache_dir = tokenizer_cache.cache_dir
# Bumped when gigatoken_tokenizer_json's output changes for the same input (the key holds gigatoken's version too).
_TOKENIZER_JSON_FORMAT = 2


def gigatoken_json_key(model_bytes: bytes, kind: str) -> dict:
    """Everything the converted text depends on: the file's sha256, its format, gigatoken's version (its
    converter) and this module's _TOKENIZER_JSON_FORMAT."""
    return {"what": "gigatoken-json", "source_sha256": hashlib.sha256(model_bytes).hexdigest(), "kind": kind,
            "gigatoken": _version("gigatoken-cachefix"), "format": _TOKENIZER_JSON_FORMAT}


def cached_gigatoken_tokenizer_json(model_bytes: bytes, kind: str) -> str:
    """gigatoken_tokenizer_json, from the local cache when an earlier process wrote a verified entry for the same
    key (transforms/tokenize/tokenizer_cache.py: keyed by the source's sha256 and the versions, the content's
    sha256 checked on load, written atomically). What it holds is only ever used through the same domain
    routing, parity check and spot checks as a fresh conversion."""
    return tokenizer_cache.cached(gigatoken_json_key(model_bytes, kind),
                                  lambda: gigatoken_tokenizer_json(model_bytes, kind).encode("utf-8")).decode("utf-8")


@functools.lru_cache(maxsize=2)
def _gigatoken_tokenizer(model_bytes: bytes, kind: str):
    """One gigatoken tokenizer per file and process (in-process workers share it, as splintr's above), and the
    lock its callers hold around `encode` (GigatokenEncoder); its encode caches are bounded before it is built
    (gigatoken applies the bound to tokenizers built afterwards)."""
    import gigatoken  # noqa: PLC0415 - optional dependency, imported only when chosen

    gigatoken.set_max_cache_bytes(GIGATOKEN_CACHE_BYTES)
    text = cached_gigatoken_tokenizer_json(model_bytes, kind)
    try:
        tok = gigatoken.Tokenizer.from_json(text)
    except Exception:  # noqa: BLE001 - a damaged cache entry: convert again, as if there were none
        tok = gigatoken.Tokenizer.from_json(gigatoken_tokenizer_json(model_bytes, kind))
    return tok, threading.Lock()


class GigatokenEncoder(_SpotChecked):
    """gigatoken over a SentencePiece BPE (byte fallback) model or an HF byte-level BPE tokenizer.json. One
    document per `encode` call on the calling thread (no thread pool: Beam's workers are the parallelism); its
    uint32 ids are read as int32 without a copy (ids < 2**31).

    The tokenizer is shared by the process's threads (Beam's multi_threading workers), and while a fresh
    tokenizer's first `encode` runs, another thread's calls fail with RuntimeError("Already borrowed"): that call
    holds the object's borrow while its thread gives up the GIL (two threads on a fresh tokenizer: all 60 calls of
    one failed, 0 of 120 once it had encoded anything; docs/BENCHMARKS.md). So calls take the tokenizer's lock,
    which costs no parallelism: `encode` holds the GIL. (In the default runner the driver's parity check makes the
    first call; worker threads that build and first use the tokenizer together, as Dask's may, could race.)

    Its batch call, `encode_batch(texts, parallel=False)`, releases the GIL but starts every call with a cold
    pretoken cache where `encode` keeps one per tokenizer: on the 24 MB bench corpus it took 1.2-1.5x `encode`'s
    CPU from a cold start in the stage's batches (64 documents / 1 MiB) and 3-4x once `encode`'s cache was warm,
    more than a second core gives back (docs/BENCHMARKS.md), so it is not used. `parallel=True` (its rayon pool)
    and a tokenizer object per thread were measured too: the pool's caches are per call as well (the 2nd and 3rd
    call over the same texts as slow as the 1st, ~3.5x a warm `encode`), and separate objects still hold the GIL
    (1.0 busy cores). Big inputs get worker processes instead (pipeline/beam_glue.py default_running_mode)."""
    name = "gigatoken"

    def __init__(self, model_bytes: bytes, sp, spot_check_every: int = 0):
        kind = references.format_of(sp)
        if kind == formats.SENTENCEPIECE and model_type(model_bytes) != "bpe":
            raise ValueError(f"gigatoken reads SentencePiece BPE models only, not {model_type(model_bytes)}")
        if kind == formats.TIKTOKEN:
            raise ValueError("gigatoken is not used for tiktoken files here (tiktoken is the reference)")
        super().__init__(sp, spot_check_every)
        self._tok, self._lock = _gigatoken_tokenizer(model_bytes, kind)

    def _encode_all(self, batch: list) -> list:
        import numpy as np  # noqa: PLC0415

        empty = np.zeros(0, dtype=np.int32)
        encode, lock = self._tok.encode, self._lock
        out = []
        for t in batch:
            if not t:
                out.append(empty)
                continue
            with lock:
                out.append(encode(t).view(np.int32))
        return out


_ENCODERS = {"kitoken": (KitokenEncoder, "kitoken"), "splintr": (SplintrEncoder, "splintr-rs"),
             "gigatoken": (GigatokenEncoder, "gigatoken-cachefix")}


def make_encoder(choice: BackendChoice, model_bytes: bytes, sp):
    """The encoder a worker uses: the reference itself, or a spot-checked fast backend routed by the domain the
    driver derived (a fast backend without one refuses to encode)."""
    if choice.name in _ENCODERS:
        encoder = _ENCODERS[choice.name][0](model_bytes, sp, choice.spot_check_every)
        domain = exact_domain.Domain.from_json(choice.domain_json)
        if domain.digest != choice.domain_sha256:
            raise BackendMismatchError("the plan's tokenizer domain does not match its digest")
        return encoder.route(domain)
    return sp


def added_texts(model_bytes: bytes, sp) -> tuple:
    """Every added / special token's text of the file (and, for a `.model`, its non-normal pieces): text the two
    libraries must treat alike (transforms/tokenize/exact_domain.py probes each)."""
    import json  # noqa: PLC0415

    texts = set(parity_texts(model_bytes, sp)[: len(parity_texts(model_bytes, sp)) // 2])
    if references.format_of(sp) == formats.HF_JSON:
        texts |= {t.get("content", "") for t in json.loads(model_bytes).get("added_tokens") or []}
    return tuple(sorted(t for t in texts if t))


def derive_domain(name: str, model_bytes: bytes, sp, encoder) -> "exact_domain.Domain":
    """The proven-equal domain of fast backend `name` against the file's reference, cached per (file, versions)
    (transforms/tokenize/exact_domain.py). Pre-tokens are compared too where gigatoken's pre-tokenizer is the
    file's (HF byte-level BPE with the GPT-2 regex)."""
    kind = references.format_of(sp)
    pre = None
    if name == "gigatoken" and kind == formats.HF_JSON and exact_domain.gigatoken_pretokenizer_applies(sp.spec):
        pre = (exact_domain.boundaries_gigatoken(), exact_domain.boundaries_hf(sp._tok.pre_tokenizer))  # noqa: SLF001
    sha = hashlib.sha256(model_bytes).hexdigest()

    def derive():
        return exact_domain.derive(name, kind, sha, lambda t: encoder._encode_all([t])[0],  # noqa: SLF001
                                   lambda t: sp.encode(t, out_type=int), added_texts(model_bytes, sp), pre)
    return exact_domain.cached_domain(name, kind, model_bytes, derive)


def parity_texts(model_bytes: bytes, sp=None) -> list:
    """Text spelling each of the tokenizer's special and added tokens (`<s>`, `<unk>`, `<0x0A>`, `<|endoftext|>`,
    an HF file's non-special added tokens such as whitespace runs...) alone and inside words: a fast backend must
    encode them as the reference does, whether or not the run's sample happens to contain them."""
    if sp is None or references.format_of(sp) == formats.SENTENCEPIECE:
        special = [p for p, _s, k in model_pieces(model_bytes) if k != 1]
    else:
        special = sorted(set(references.special_tokens_of(sp)) | {t[0] for t in getattr(sp, "added", ())})
    return special + [f"x{p} {p}y\n" for p in special] + ["".join(special)]


def _fast_unsupported(kind: str, model_bytes: bytes) -> str:
    """Why no fast backend can be exact for this file, or ""."""
    if kind == formats.SENTENCEPIECE:
        algorithm = model_type(model_bytes)
        return "" if algorithm == "bpe" else f"{algorithm} model: only BPE models have an exact fast path"
    if kind == formats.TIKTOKEN:
        return "tiktoken files are encoded by tiktoken itself"
    return ""


REFERENCE_DISTRIBUTIONS = {formats.SENTENCEPIECE: "sentencepiece", formats.HF_JSON: "tokenizers",
                           formats.TIKTOKEN: "tiktoken"}


def choose_backend(requested: str, model_bytes: bytes, sp, sample_texts: list,
                   failed: frozenset = frozenset()) -> BackendChoice:
    """Decide the backend at the driver: the reference as asked (`reference`, or `sentencepiece` for a `.model`);
    a fast backend only after id-for-id parity with the reference on `sample_texts` (the run's own documents)
    and the tokenizer's special tokens spelled as text. `auto` tries FAST_BACKENDS fastest first and takes the
    first that passes; a fast backend asked for explicitly but failing is a fallback too. Every rejection's
    reason is logged and kept in the choice's `reason`: never different tokens. `failed`: the resume keys of
    backends that failed a spot check in an earlier run of this generation (pipeline/shard/resume.py); never
    chosen again."""
    kind = references.format_of(sp)
    if requested not in BACKENDS:
        raise formats.TokenizerError(f"--tokenizer-backend {requested!r}: choose one of {', '.join(BACKENDS)}")
    if requested == "sentencepiece" and kind != formats.SENTENCEPIECE:
        raise formats.TokenizerError(f"--tokenizer-backend sentencepiece: the tokenizer is a {kind} file; use "
                                     f"reference (its own library, {REFERENCE_NAMES[kind]}), auto or gigatoken")
    if requested in ("reference", "sentencepiece"):
        return _reference(kind, requested, "requested")
    problem = _fast_unsupported(kind, model_bytes)
    if problem:
        return _fallback(kind, requested, problem)
    if not sample_texts:
        return _fallback(kind, requested, "no documents to check parity on")
    rejected = []
    for name in (FAST_BACKENDS[kind] if requested == "auto" else (requested,)):
        choice, why = _try_backend(name, requested, model_bytes, sp, sample_texts)
        if choice is not None and BackendChoice(name, requested, "", *choice).resume_key in failed:
            choice, why = None, "failed a spot check in an earlier run of this generation"
        if choice is not None:
            reason = f"parity with {REFERENCE_NAMES[kind]} on the run's sample"
            if rejected:
                reason += f" ({'; '.join(rejected)})"
                LOG.warning("tokenizer backend: using %s (%s)", name, "; ".join(rejected))
            return BackendChoice(name, requested, reason, *choice)
        rejected.append(f"{name}: {why}")
        LOG.info("tokenizer backend: not %s (%s)", name, why)
    return _fallback(kind, requested, "; ".join(rejected))


def _try_backend(name: str, requested: str, model_bytes: bytes, sp, sample_texts: list):
    """((version, documents, tokens, ids sha256, spot-check interval), "") when `name` matches the reference on
    every sample text, else (None, why not)."""
    kind = references.format_of(sp)
    if (name, kind) not in SPOT_CHECK_EVERY:
        return None, f"does not read {kind} files"
    encoder_class, distribution = _ENCODERS[name]
    version = _version(distribution)
    if not version:
        return None, f"not installed (pip install {distribution})"
    try:
        encoder = encoder_class(model_bytes, sp, spot_check_every=0)
    except Exception as e:  # noqa: BLE001 - any failure to load means: not usable
        return None, f"cannot load the model: {e}"
    domain = derive_domain(name, model_bytes, sp, encoder)
    encoder.route(domain)
    for text in parity_texts(model_bytes, sp):
        if _as_list(encoder.encode(text)) != _as_list(sp.encode(text, out_type=int)):
            return None, f"the special token text {text!r} encodes differently from {REFERENCE_NAMES[kind]}"
    digest = hashlib.sha256()
    tokens = 0
    # The reference's batch call on every core: the reference side is several times the fast backend's CPU, and
    # this runs at the driver before any worker starts (the job's fixed cost).
    wanted = sp.encode(list(sample_texts), out_type=int, num_threads=len(os.sched_getaffinity(0)))
    for i, (text, want) in enumerate(zip(sample_texts, wanted)):
        want = _as_list(want)
        if _as_list(encoder.encode(text)) != want:
            return None, f"parity sample document {i} differs from {REFERENCE_NAMES[kind]}"
        tokens += len(want)
        digest.update(len(want).to_bytes(4, "little"))
        digest.update(struct.pack(f"<{len(want)}I", *want))
    return (version, len(sample_texts), tokens, digest.hexdigest(), SPOT_CHECK_EVERY[name, kind], domain.to_json(),
            domain.digest, _version(REFERENCE_DISTRIBUTIONS[kind]), kind), ""


def _reference(kind: str, requested: str, reason: str) -> BackendChoice:
    version = _version(REFERENCE_DISTRIBUTIONS[kind])
    return BackendChoice(REFERENCE_NAMES[kind], requested, reason, version, reference_version=version,
                         reference_format=kind)


def _fallback(kind: str, requested: str, reason: str) -> BackendChoice:
    LOG.warning("tokenizer backend: using %s (%s)", REFERENCE_NAMES[kind], reason)
    return _reference(kind, requested, reason)


def sample_documents(paths: list, text_field: str, seed: int, limit_bytes: int = PARITY_SAMPLE_BYTES,
                     parse=None, read=None) -> list:
    """Texts of a seeded sample of the run's documents, about `limit_bytes` of them: records from the input
    files in a seeded order, read with the job's own bounded reader and parser (damaged records skipped)."""
    order = sorted(paths, key=lambda p: hashlib.sha256(f"{seed}:{p}".encode()).digest())
    out: list = []
    total = 0
    for path in order:
        for _line, data in read(path):
            doc = parse(data)
            if doc is None:
                continue
            out.append(doc)
            total += len(doc)
            if total >= limit_bytes:
                return out
    return out


@dataclass
class ParityReport:
    """For tests and the benchmark: how two encoders compare on a list of texts."""
    documents: int = 0
    mismatches: list = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.mismatches


def compare(sp, encoder, texts: list, limit: Optional[int] = None) -> ParityReport:
    report = ParityReport()
    for i, text in enumerate(texts[:limit]):
        report.documents += 1
        if _as_list(sp.encode(text, out_type=int)) != _as_list(encoder.encode(text)):
            report.mismatches.append(i)
    return report
