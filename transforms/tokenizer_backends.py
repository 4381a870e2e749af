"""Exact fast tokenizer backends: a faster encoder is used only where it provably gives SentencePiece's ids.

Tokenizing is ~99% of the shard job's CPU. kitoken (Rust) reads the same SentencePiece model file and, with
special-token parsing off, gives ids identical to `sp.encode` on BPE models at about a third of the CPU. Trust
is earned, not assumed, in three steps:
1. the model type: unigram models stay on SentencePiece (its float score ties resolve differently elsewhere);
2. at the driver, a seeded ~1 MB sample of the run's own documents must match SentencePiece id for id, or
   the run falls back to SentencePiece with the reason logged and recorded in the manifest;
3. on the workers, a seeded 1-in-N spot check re-encodes documents with SentencePiece; one mismatch fails the
   run (`BackendMismatchError`) rather than write different tokens.
The backend never changes the shards (byte-identical, tested) and is not part of the dataset's fingerprint; the
manifest records which backend ran and its parity sample, the only fields that may differ between backends.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import zlib
from dataclasses import asdict, dataclass, field
from typing import Optional

LOG = logging.getLogger("pileprep.tokenizer")
BACKENDS = ("auto", "sentencepiece", "kitoken")
SPOT_CHECK_EVERY = 64  # documents: ~1.5% extra SentencePiece work with a fast backend
PARITY_SAMPLE_BYTES = 1 << 20

# sentencepiece_model.proto: ModelProto.trainer_spec = 2, TrainerSpec.model_type = 3 (UNIGRAM 1, BPE 2, ...)
_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


class BackendMismatchError(RuntimeError):
    """A fast backend produced ids that differ from SentencePiece's: the run stops, nothing is written."""


@dataclass(frozen=True)
class BackendChoice:
    """What the driver decided; goes into the plan (workers build the same encoder) and the manifest."""
    name: str  # the backend that runs: "sentencepiece" or "kitoken"
    requested: str
    reason: str
    version: str = ""
    parity_documents: int = 0
    parity_tokens: int = 0
    parity_ids_sha256: str = ""
    spot_check_every: int = 0

    def to_manifest(self) -> dict:
        return asdict(self)


def _varint(buf: bytes, i: int):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) of a serialized protobuf message, top level only."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield num, wire, value


def model_type(model_bytes: bytes) -> str:
    """The SentencePiece model's algorithm, read from the proto's wire format (sentencepiece's own generated
    module needs a newer protobuf runtime than the pinned one). Unigram is the proto's default."""
    for num, wire, value in _fields(model_bytes):
        if num == 2 and wire == 2:
            for n, w, v in _fields(value):
                if n == 3 and w == 0:
                    return _MODEL_TYPES.get(v, f"type-{v}")
    return "unigram"


def _kitoken_version() -> str:
    try:
        return importlib.metadata.version("kitoken")
    except importlib.metadata.PackageNotFoundError:
        return ""


class KitokenEncoder:
    """SentencePiece-compatible `encode(texts, out_type=int, num_threads=1)` on kitoken, spot-checked.

    Special-token parsing is off: SentencePiece's `encode` treats `<s>` in text as plain characters, and so
    must we. Every SPOT_CHECK_EVERY-th document (by a hash of its text: the same documents whatever the worker
    or bundle) is re-encoded with SentencePiece and compared.
    """

    def __init__(self, model_bytes: bytes, sp, spot_check_every: int = SPOT_CHECK_EVERY):
        import kitoken  # noqa: PLC0415 - optional dependency, imported only when chosen

        self._kt = kitoken.Kitoken.from_sentencepiece(model_bytes)
        self._sp = sp
        self.reference = sp  # transforms.tokenizer.encode_batch sends very long texts here (kitoken's memory)
        self.spot_check_every = spot_check_every
        self.spot_checked = 0

    def encode(self, texts, out_type=int, num_threads=1):  # noqa: ARG002 - SentencePiece's signature
        single = isinstance(texts, str)
        batch = [texts] if single else list(texts)
        ids = [self._kt.encode(t, False) for t in batch]
        if self.spot_check_every:
            for text, got in zip(batch, ids):
                if zlib.crc32(text.encode("utf-8", "surrogatepass")) % self.spot_check_every == 0:
                    self.spot_checked += 1
                    want = self._sp.encode(text, out_type=int)
                    if want != got:
                        raise BackendMismatchError(
                            f"kitoken and SentencePiece disagree on a {len(text)}-character document (first ids "
                            f"{got[:8]} vs {want[:8]}); rerun with --tokenizer-backend sentencepiece")
        return ids[0] if single else ids


def make_encoder(choice: BackendChoice, model_bytes: bytes, sp):
    """The encoder a worker uses: SentencePiece itself, or a spot-checked fast backend."""
    if choice.name == "kitoken":
        return KitokenEncoder(model_bytes, sp, choice.spot_check_every)
    return sp


def choose_backend(requested: str, model_bytes: bytes, sp, sample_texts: list) -> BackendChoice:
    """Decide the backend at the driver: `sentencepiece` as asked; `kitoken` or `auto` only on a BPE model and
    after id-for-id parity with SentencePiece on `sample_texts` (the run's own documents). `kitoken` asked for
    explicitly but failing the checks is a fallback too, with the reason: never different tokens."""
    if requested not in BACKENDS:
        raise ValueError(f"--tokenizer-backend {requested!r}: choose one of {', '.join(BACKENDS)}")
    if requested == "sentencepiece":
        return BackendChoice("sentencepiece", requested, "requested")
    kind = model_type(model_bytes)
    if kind != "bpe":
        return _fallback(requested, f"{kind} model: only BPE models have an exact fast path")
    version = _kitoken_version()
    if not version:
        return _fallback(requested, "kitoken is not installed (pip install 'pileprep[fast]')")
    try:
        encoder = KitokenEncoder(model_bytes, sp, spot_check_every=0)
    except Exception as e:  # noqa: BLE001 - any failure to load means: not usable
        return _fallback(requested, f"kitoken cannot load the model: {e}")
    digest = hashlib.sha256()
    tokens = 0
    for i, text in enumerate(sample_texts):
        want = sp.encode(text, out_type=int)
        got = encoder.encode(text)
        if got != want:
            return _fallback(requested, f"parity sample document {i} differs from SentencePiece")
        tokens += len(want)
        digest.update(len(want).to_bytes(4, "little"))
        digest.update(b"".join(t.to_bytes(4, "little") for t in want))
    if not sample_texts:
        return _fallback(requested, "no documents to check parity on")
    return BackendChoice("kitoken", requested, "parity with SentencePiece on the run's sample", version,
                         len(sample_texts), tokens, digest.hexdigest(), SPOT_CHECK_EVERY)


def _fallback(requested: str, reason: str) -> BackendChoice:
    LOG.warning("tokenizer backend: using sentencepiece (%s)", reason)
    return BackendChoice("sentencepiece", requested, reason)


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
        if sp.encode(text, out_type=int) != encoder.encode(text):
            report.mismatches.append(i)
    return report
