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
is part of every unit's resume key (`BackendChoice.resume_key`, pipeline/shard/markers.py backend_key), and a
backend that failed a spot check is recorded in the staging so no later run reuses its units or picks it again.
The manifest records which backend ran, its domain, parity sample and per-backend counts: the only fields that
may differ.
"""
from __future__ import annotations

import hashlib
import logging
import os
import struct
from dataclasses import asdict, dataclass, field
from typing import Optional

from transforms.tokenize import exact_domain, formats, references
from transforms.tokenize.fast_encoders import (  # noqa: F401 - re-exported: the backends' public names
    _ENCODERS, GIGATOKEN_CACHE_BYTES, TOKENIZER_CACHE_ENV, GigatokenEncoder, KitokenEncoder, SplintrEncoder,
    _gigatoken_tokenizer, cached_gigatoken_tokenizer_json, gigatoken_json_key, gigatoken_tokenizer_json,
    splintr_unsupported)
from transforms.tokenize.sentencepiece_model import (  # noqa: F401 - re-exported: the package's proto reader
    _PIECE_TYPES, _spec, model_pieces, model_type)
from transforms.tokenize.spot_check import (  # noqa: F401 - re-exported
    FAULT_ENV, REFERENCE_NAMES, BackendMismatchError, _as_list, _version, spot_check_key, utf8_size)

LOG = logging.getLogger("pileprep.tokenizer")
BACKENDS = ("auto", "reference", "sentencepiece", "gigatoken", "kitoken", "splintr")
# What `auto` may choose: gigatoken only (~32x sp.encode per thread on Llama 2, bench/tokenizer_backend_bench.py;
# the only fast backend that reads an HF tokenizer.json). splintr and kitoken stay selectable by name but are not
# candidates of `auto`: kitoken breaks SentencePiece's score ties by piece id instead of the leftmost pair
# (tests/fixtures/sp_models.py LLAMA_WHITESPACE_ORDER), and the exact domain (transforms/tokenize/exact_domain.py)
# compares single code points, so a tie inside a multi-character run is outside what it proves; with one
# candidate, `auto`'s exactness rests on the domain plus gigatoken's tie tests, not on a sampled parity check.
FAST_BACKENDS = {formats.SENTENCEPIECE: ("gigatoken",), formats.HF_JSON: ("gigatoken",), formats.TIKTOKEN: ()}
# Spot check 1 document in N: the check re-encodes ~1/N of the bytes with the reference, `speed-up` times slower
# than the backend, so it costs ~speed-up/N of the encode; N >= 20 x the measured speed-up keeps it <= 5% of the
# tokenize stage (the speed-ups and the check's measured cost: docs/BENCHMARKS.md, "Spot checks and parity sample").
SPOT_CHECK_EVERY = {("gigatoken", formats.SENTENCEPIECE): 1024, ("gigatoken", formats.HF_JSON): 2048,
                    ("splintr", formats.SENTENCEPIECE): 256, ("kitoken", formats.SENTENCEPIECE): 128}
# The driver's parity sample: the run's documents checked against the reference before any worker starts. The
# reference encodes it on one thread while both cores wait, so it is start-up cost and stays at 1 MB
# (docs/BENCHMARKS.md, "Spot checks and parity sample"); the workers' spot checks cover the rest of the run.
PARITY_SAMPLE_BYTES = 1 << 20

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
        versions and, for a fast one, the digest of the domain it was given (pipeline/shard/markers.py backend_key)."""
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
    backends that failed a spot check in an earlier run of this generation (pipeline/shard/markers.py
    failed_backends); never chosen again."""
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
    mismatches: list[int] = field(default_factory=list)  # indexes of the texts whose ids differ

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
