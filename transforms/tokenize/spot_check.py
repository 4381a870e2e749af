"""The spot-checked wrapper every fast tokenizer backend shares: routing by the exact domain, the 1-in-N re-encode
with the reference, and the per-backend counts that go into the manifest.

transforms/tokenize/tokenizer_backends.py decides which backend runs; transforms/tokenize/fast_encoders.py holds
the backends themselves (each a subclass of `SpotChecked` with its own `_encode_all`).
"""
from __future__ import annotations

import importlib.metadata
import os
import zlib

from transforms.tokenize import formats, references

REFERENCE_NAMES = {formats.SENTENCEPIECE: "sentencepiece", formats.HF_JSON: "tokenizers", formats.TIKTOKEN: "tiktoken"}


class BackendMismatchError(RuntimeError):
    """A fast backend produced ids that differ from SentencePiece's: the run stops, nothing is written."""

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


class SpotChecked:
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

    def route(self, domain) -> "SpotChecked":
        """Send only documents inside `domain` (transforms/tokenize/exact_domain.py) to the fast backend."""
        self.router = domain.router()
        return self

    def _encode_all(self, batch: list) -> list:
        raise NotImplementedError

    def count_as_one(self, text: str, before: dict, encoded: bool) -> None:
        """Count a long text encoded in pieces (transforms/tokenize/tokenizer.py `_encode_long`) as one document
        of its whole UTF-8 size: `encode` counted each piece as a document, and without the space a later piece
        drops under SentencePiece's dummy prefix (long_documents.encode_in_pieces). `before`: `counts` before the
        pieces; `encoded`: False when the text was Rejected (not tokenized, so not counted). The text counts as
        the reference's when any piece went to the reference, and as spot-checked when any piece was."""
        counts = self.counts
        reference = counts["reference_documents"] > before["reference_documents"]
        checked = counts["checked_documents"] > before["checked_documents"]
        checked_bytes = counts["checked_bytes"] - before["checked_bytes"]
        counts.update(before)  # in place: the job reads the same dict (transforms/shard/tokenize_unit.py spot_before)
        if not encoded:
            return
        size = utf8_size(text)
        kind = "reference" if reference else "fast"
        counts["documents"] += 1
        counts["bytes"] += size
        counts[f"{kind}_documents"] += 1
        counts[f"{kind}_bytes"] += size
        if checked:
            counts["checked_documents"] += 1
            counts["checked_bytes"] += checked_bytes

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

    def __init__(self, sp, owner: "SpotChecked"):
        self._sp = sp
        self._owner = owner

    def __getattr__(self, name):
        return getattr(self._sp, name)

    def encode(self, texts, out_type=int, num_threads=1):
        ids = self._sp.encode(texts, out_type=out_type, num_threads=num_threads)  # a panic: nothing counted
        for text in [texts] if isinstance(texts, str) else texts:
            self._owner._count_reference(utf8_size(text))  # noqa: SLF001 - the owner's counters
        return ids
