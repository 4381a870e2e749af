"""Exact fast tokenizer backends: a faster encoder is used only where it provably gives SentencePiece's ids.

Tokenizing is ~99% of the shard job's CPU. kitoken (Rust) reads the same SentencePiece model file and, with
special-token parsing off, gives ids identical to `sp.encode` on BPE models at about a third of the CPU;
splintr-rs (Rust, built from the model's pieces and scores) is exact too on the BPE models it accepts but no
faster than SentencePiece per CPU-second, so `auto` tries kitoken first. Trust is earned, not assumed, in steps:
1. the model: unigram models stay on SentencePiece (its float score ties resolve differently elsewhere), and a
   backend refuses a model whose normalizer or pieces it does not reproduce (`splintr_unsupported`);
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
import struct
import zlib
from dataclasses import asdict, dataclass, field
from typing import Optional

LOG = logging.getLogger("pileprep.tokenizer")
BACKENDS = ("auto", "sentencepiece", "kitoken", "splintr")
# The order `auto` tries them in, fastest first per CPU-second on Llama 2 (bench/tokenizer_backend_bench.py):
# kitoken ~2-3x SentencePiece, splintr-rs 0.22's SpmTokenizer ~1x; both exact on the BPE models they accept.
FAST_BACKENDS = ("kitoken", "splintr")
SPOT_CHECK_EVERY = 64  # documents: ~1.5% extra SentencePiece work with a fast backend
PARITY_SAMPLE_BYTES = 1 << 20

# sentencepiece_model.proto: ModelProto.trainer_spec = 2, TrainerSpec.model_type = 3 (UNIGRAM 1, BPE 2, ...)
_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}


class BackendMismatchError(RuntimeError):
    """A fast backend produced ids that differ from SentencePiece's: the run stops, nothing is written."""


@dataclass(frozen=True)
class BackendChoice:
    """What the driver decided; goes into the plan (workers build the same encoder) and the manifest."""
    name: str  # the backend that runs: "sentencepiece", "kitoken" or "splintr"
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


# sentencepiece_model.proto, the fields an encode depends on (defaults as in the proto)
_PIECE_TYPES = {1: "normal", 2: "unknown", 3: "control", 4: "user-defined", 5: "unused", 6: "byte"}


def _spec(model_bytes: bytes) -> dict:
    """What a SentencePiece BPE encode depends on beyond the pieces: the normalizer (ModelProto field 3) and the
    trainer flags that change encoding (field 2), with the proto's defaults where a field is absent."""
    spec = {"normalizer": "nmt_nfkc", "charsmap": b"", "add_dummy_prefix": 1, "remove_extra_whitespaces": 1,
            "escape_whitespaces": 1, "byte_fallback": 0, "treat_whitespace_as_suffix": 0}
    names = {(3, 1): "normalizer", (3, 2): "charsmap", (3, 3): "add_dummy_prefix", (3, 4): "remove_extra_whitespaces",
             (3, 5): "escape_whitespaces", (2, 35): "byte_fallback", (2, 24): "treat_whitespace_as_suffix"}
    for num, wire, value in _fields(model_bytes):
        if num in (2, 3) and wire == 2:
            for n, _w, v in _fields(value):
                if (num, n) in names:
                    spec[names[num, n]] = v.decode("utf-8", "replace") if (num, n) == (3, 1) else v
    return spec


def model_pieces(model_bytes: bytes) -> list:
    """(piece, score, type) of every piece, in id order, from the proto (ModelProto.pieces = 1; piece 1, score 2
    as a float32, type 3 defaulting to NORMAL): the model file, not a processor, is what a backend is built from."""
    out = []
    for num, wire, value in _fields(model_bytes):
        if num == 1 and wire == 2:
            piece, score, kind = "", 0.0, 1
            for n, w, v in _fields(value):
                if n == 1 and w == 2:
                    piece = v.decode("utf-8")
                elif n == 2 and w == 5:
                    score = struct.unpack("<f", v)[0]
                elif n == 3 and w == 0:
                    kind = v
            out.append((piece, score, kind))
    return out


def splintr_unsupported(model_bytes: bytes) -> str:
    """Why splintr's SentencePiece BPE (`SpmTokenizer`, built from pieces and scores) cannot reproduce this model's
    `sp.encode`, or "" when it can. It has no normalizer, always prepends the dummy `▁`, keeps repeated
    whitespace, falls back to `<0xNN>` byte pieces and merges every piece it is given: so the model must have
    the identity normalizer (no charsmap), those whitespace flags, byte fallback, and no user-defined or unused
    pieces (SentencePiece matches the former whole and never emits the latter)."""
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


class _SpotChecked:
    """SentencePiece-compatible `encode(texts, out_type=int, num_threads=1)` on a fast backend, spot-checked.

    Every `spot_check_every`-th document (by a hash of its text: the same documents whatever the worker or
    bundle) is re-encoded with SentencePiece and compared; a mismatch raises BackendMismatchError. `reference`
    is SentencePiece itself: transforms.tokenizer.encode_batch sends very long texts to it (the fast backends'
    memory per byte is higher)."""
    name = ""

    def __init__(self, sp, spot_check_every: int):
        self._sp = sp
        self.reference = sp
        self.spot_check_every = spot_check_every
        self.spot_checked = 0

    def _encode_all(self, batch: list) -> list:
        raise NotImplementedError

    def encode(self, texts, out_type=int, num_threads=1):  # noqa: ARG002 - SentencePiece's signature
        single = isinstance(texts, str)
        batch = [texts] if single else list(texts)
        ids = self._encode_all(batch)
        if self.spot_check_every:
            for text, got in zip(batch, ids):
                if zlib.crc32(text.encode("utf-8", "surrogatepass")) % self.spot_check_every == 0:
                    self.spot_checked += 1
                    want = self._sp.encode(text, out_type=int)
                    if want != list(got):
                        raise BackendMismatchError(
                            f"{self.name} and SentencePiece disagree on a {len(text)}-character document (first ids "
                            f"{list(got[:8])} vs {want[:8]}); rerun with --tokenizer-backend sentencepiece")
        return ids[0] if single else ids


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


class SplintrEncoder(_SpotChecked):
    """splintr's SentencePiece BPE (`SpmTokenizer`, llama.cpp's SPM merge by piece score) built from the model
    file's own pieces and scores; refused (ValueError) for a model whose encode it does not reproduce
    (`splintr_unsupported`). Built with no BOS/EOS and no special tokens, so `<s>` written in the text is
    characters, as in `sp.encode` (checked at the driver by `parity_texts`). Each document is its own
    `encode_batch([text])` call: unlike `encode`/`encode_ordinary`, which hold the GIL for the whole document,
    the batch call releases it, so Beam's worker threads in one process tokenize in parallel; one document per
    call keeps it to one thread's work (Beam's workers are the parallelism). bench/tokenizer_backend_bench.py."""
    name = "splintr"

    def __init__(self, model_bytes: bytes, sp, spot_check_every: int = SPOT_CHECK_EVERY):
        import splintr  # noqa: PLC0415 - optional dependency, imported only when chosen

        problem = splintr_unsupported(model_bytes)
        if problem:
            raise ValueError(problem)
        super().__init__(sp, spot_check_every)
        pieces = model_pieces(model_bytes)
        self._tok = splintr.SpmTokenizer([p for p, _s, _k in pieces], [s for _p, s, _k in pieces], None, None)

    def _encode_all(self, batch: list) -> list:
        return [self._tok.encode_batch([t])[0] for t in batch]


_ENCODERS = {"kitoken": (KitokenEncoder, "kitoken"), "splintr": (SplintrEncoder, "splintr-rs")}


def make_encoder(choice: BackendChoice, model_bytes: bytes, sp):
    """The encoder a worker uses: SentencePiece itself, or a spot-checked fast backend."""
    if choice.name in _ENCODERS:
        return _ENCODERS[choice.name][0](model_bytes, sp, choice.spot_check_every)
    return sp


def parity_texts(model_bytes: bytes) -> list:
    """Text spelling each of the model's special pieces (`<s>`, `<unk>`, `<0x0A>`...) alone and inside words: a
    fast backend must encode them as SentencePiece does (as plain characters), whether or not the run's sample
    happens to contain them."""
    special = [p for p, _s, k in model_pieces(model_bytes) if k != 1]
    return special + [f"x{p} {p}y\n" for p in special]


def choose_backend(requested: str, model_bytes: bytes, sp, sample_texts: list) -> BackendChoice:
    """Decide the backend at the driver: `sentencepiece` as asked; a fast backend only on a BPE model and after
    id-for-id parity with SentencePiece on `sample_texts` (the run's own documents) and the model's special
    pieces spelled as text. `auto` tries FAST_BACKENDS fastest first and takes the first that passes; a fast
    backend asked for explicitly but failing is a fallback too. Every rejection's reason is logged and kept in
    the choice's `reason`: never different tokens."""
    if requested not in BACKENDS:
        raise ValueError(f"--tokenizer-backend {requested!r}: choose one of {', '.join(BACKENDS)}")
    if requested == "sentencepiece":
        return BackendChoice("sentencepiece", requested, "requested")
    kind = model_type(model_bytes)
    if kind != "bpe":
        return _fallback(requested, f"{kind} model: only BPE models have an exact fast path")
    if not sample_texts:
        return _fallback(requested, "no documents to check parity on")
    rejected = []
    for name in (FAST_BACKENDS if requested == "auto" else (requested,)):
        choice, why = _try_backend(name, requested, model_bytes, sp, sample_texts)
        if choice is not None:
            reason = "parity with SentencePiece on the run's sample"
            if rejected:
                reason += f" ({'; '.join(rejected)})"
                LOG.warning("tokenizer backend: using %s (%s)", name, "; ".join(rejected))
            return BackendChoice(name, requested, reason, *choice)
        rejected.append(f"{name}: {why}")
        LOG.info("tokenizer backend: not %s (%s)", name, why)
    return _fallback(requested, "; ".join(rejected))


def _try_backend(name: str, requested: str, model_bytes: bytes, sp, sample_texts: list):
    """((version, documents, tokens, ids sha256, spot-check interval), "") when `name` matches SentencePiece on
    every sample text, else (None, why not)."""
    encoder_class, distribution = _ENCODERS[name]
    version = _version(distribution)
    if not version:
        return None, f"not installed (pip install {distribution})"
    try:
        encoder = encoder_class(model_bytes, sp, spot_check_every=0)
    except Exception as e:  # noqa: BLE001 - any failure to load means: not usable
        return None, f"cannot load the model: {e}"
    for text in parity_texts(model_bytes):
        if list(encoder.encode(text)) != sp.encode(text, out_type=int):
            return None, f"the model's special piece {text!r} encodes differently from SentencePiece"
    digest = hashlib.sha256()
    tokens = 0
    for i, text in enumerate(sample_texts):
        want = sp.encode(text, out_type=int)
        if list(encoder.encode(text)) != want:
            return None, f"parity sample document {i} differs from SentencePiece"
        tokens += len(want)
        digest.update(len(want).to_bytes(4, "little"))
        digest.update(b"".join(t.to_bytes(4, "little") for t in want))
    return (version, len(sample_texts), tokens, digest.hexdigest(), SPOT_CHECK_EVERY), ""


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
