"""The fast tokenizer backends: gigatoken (SentencePiece BPE and HF byte-level BPE), splintr-rs and kitoken
(SentencePiece BPE; by name only, never chosen by `auto`: transforms/tokenize/tokenizer_backends.py
FAST_BACKENDS). Each is a `SpotChecked` encoder (transforms/tokenize/spot_check.py): routed by the exact domain,
spot-checked against the reference.
"""
from __future__ import annotations

import functools
import hashlib
import threading

from transforms.tokenize import formats, references, tokenizer_cache
from transforms.tokenize.sentencepiece_model import _PIECE_TYPES, _spec, model_pieces, model_type
from transforms.tokenize.spot_check import SpotChecked, _version

GIGATOKEN_CACHE_BYTES = 64 << 20  # per encoder; gigatoken's default is 512 MiB (tests/e2e/test_memory_bounds.py)


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

class KitokenEncoder(SpotChecked):
    """kitoken reads the SentencePiece model file itself. Special-token parsing is off: SentencePiece's `encode`
    treats `<s>` in text as plain characters, and so must we."""
    name = "kitoken"

    def __init__(self, model_bytes: bytes, sp, spot_check_every: int = 0):
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


class SplintrEncoder(SpotChecked):
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

    def __init__(self, model_bytes: bytes, sp, spot_check_every: int = 0):
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
# are paid again by every process that builds the encoder without it (docs/BENCHMARKS.md, "The converted
# tokenizer.json, cached between processes"). "off" disables it.
TOKENIZER_CACHE_ENV = tokenizer_cache.TOKENIZER_CACHE_ENV
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


class GigatokenEncoder(SpotChecked):
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
    (1.0 busy cores). Big inputs get worker processes instead (pipeline/ops/runners.py default_running_mode)."""
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
