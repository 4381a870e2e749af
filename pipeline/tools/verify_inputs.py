"""`pileprep verify --inputs`: what became of each sampled input document (pipeline/tools/verify_audit.py samples and
re-tokenizes them; this module judges each one).

A document of the inputs is, in the committed dataset, exactly one of:

* written: found through the shards' provenance, one copy (or as many as its source weight asks for), its tokens
  equal to a fresh tokenization, and, where the format's decode is exact, decode(tokens) == the text (a
  tokenizer pattern that drops characters re-encodes to the same ids, so only the round trip catches it);
* removed by --near-dedup (`near_duplicate`: its keeper must be written or dropped by its own source's weight;
  `near_duplicate_of_committed`) or by
  --decontaminate (`contaminated`: the recorded n-gram must be in its text), as the generation's near-dedup
  sidecar files say (pipeline/shard/near_dedup/partitions.py `write_partition`; their sha256 is checked here);
* dropped by a source weight below 1 (transforms/shard/mixture.py `copies` gives it no copy; counted as filtered
  `mixture_weight` in the manifest).

Anything else (absent with no recorded reason, written and also recorded as removed, a wrong number of copies) is
a problem: verify fails only on a real mismatch.
"""
from __future__ import annotations

import collections
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from model_contract import ContractError, Manifest
from model_contract.dataset_paths import resolve_dataset_path
from transforms.io import io_utils

NEAR_DUPLICATE, OF_COMMITTED, CONTAMINATED = "near_duplicate", "near_duplicate_of_committed", "contaminated"
DROPPED_BY_WEIGHT = "mixture_weight"


@dataclass
class Removals:
    """What the dataset records as removed: sidecar rows by document id, and the source weights."""
    # doc_id -> its near-dedup sidecar row, one JSON line as written: {id, reason, keeper, ...}
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)  # source -> weight (train split only)
    seed: int = 0

    def keepers(self, ids) -> set:
        return {int(self.rows[i]["keeper"]) for i in ids
                if i in self.rows and self.rows[i].get("reason") == NEAR_DUPLICATE and "keeper" in self.rows[i]}

    def copies(self, doc_id: int, source: str, want_split: Optional[str]) -> int:
        """Copies the mixture asks for: 1 without weights or for a --val/--test-input document."""
        if not self.weights or want_split is not None:
            return 1
        from transforms.shard import mixture  # noqa: PLC0415 - the definition of the weighting, not the job's graph

        return mixture.copies(doc_id, float(self.weights.get(source, 1.0)), self.seed)


def load_removals(manifest: Manifest, manifest_file: str, problems: list) -> Removals:
    near = manifest.extra.get("near_dedup") or {}
    rows: dict = {}
    for listed in near.get("sidecars") or []:
        rel = listed.get("path") if isinstance(listed, dict) else None
        try:
            data = io_utils.read_bytes(resolve_dataset_path(manifest_file, str(rel)))
        except (ContractError, OSError) as e:
            problems.append(f"near-dedup sidecar {rel}: cannot be read ({type(e).__name__}: {e})")
            continue
        if hashlib.sha256(data).hexdigest() != listed.get("sha256") or len(data) != listed.get("bytes"):
            problems.append(f"near-dedup sidecar {rel}: size or sha256 differs from the manifest's")
            continue
        for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
            try:
                row = json.loads(line)
                rows[int(row["id"])] = row
            except (ValueError, KeyError, TypeError):
                problems.append(f"near-dedup sidecar {rel} line {n}: not a removal row")
    config = manifest.config or {}
    weights = config.get("source_weights") or {}
    if not isinstance(weights, dict):
        weights = {}
    seed = config.get("seed", 0)
    return Removals(rows, weights, seed if isinstance(seed, int) else 0)


def held_inputs(manifest: Manifest, paths: list) -> tuple:
    """({given path: the manifest's name for it}, problems) for the audit's input files. The manifest records
    `inputs[].path` as typed at shard time ("c1.jsonl", "/tmp/x/c1.jsonl"), so a literal comparison refused a
    correct file spelled differently or named from another directory (hostile review rv2, F5). A file is the
    manifest's input when it is named the same, or resolves (symlinks, "..", the working directory) to the same
    absolute file as an absolute manifest path, or else has the content sha256 the ledger records for exactly one
    held input. Nothing else is matched: a relative manifest path is never resolved against a guessed directory."""
    import os  # noqa: PLC0415

    from model_contract.hashing import sha256_file  # noqa: PLC0415

    held = [str(row["path"]) for row in manifest.inputs]
    local_abs = {os.path.realpath(h): h for h in held if io_utils.is_local(h) and os.path.isabs(h)}
    by_sha = collections.defaultdict(list)
    for row in manifest.ledger or []:
        if row.sha256 and row.path in held:
            by_sha[row.sha256].append(row.path)
    names, problems = {}, []
    for path in paths:
        if path in held:
            names[path] = path
        elif io_utils.is_local(path) and os.path.realpath(path) in local_abs:
            names[path] = local_abs[os.path.realpath(path)]
        else:
            same = by_sha.get(sha256_file(path, opener=io_utils.open_read)[1], []) if by_sha else []
            if len(same) == 1:
                names[path] = same[0]
            elif same:
                problems.append(f"{path}: its content is that of several inputs of this dataset ({', '.join(same)})"
                                f"; name it as the manifest does")
    return names, problems


def record_source(data: bytes, source_fields) -> str:
    """The document's source as the job names it (transforms/shard/documents.py: first non-empty string field)."""
    from transforms.shard.documents import UNKNOWN_SOURCE  # noqa: PLC0415

    record = json.loads(data)
    for name in source_fields:
        cur = record
        for part in name.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if isinstance(cur, str) and cur:
            return cur
    return UNKNOWN_SOURCE


@dataclass(frozen=True)
class RoundTrip:
    """How the audit checks decode(tokens) against a document: `decode` (ids -> text; None when the format's
    decode cannot give the text back, so nothing is checked), `normalize` (text -> the text as the tokenizer's
    normalizer rewrites it, when it has one) and `note`, the audit's line about it ("" when decode == text is
    checked as is). A check that is not made is said in the output, never counted as passed (hostile review of
    issue 28, F3: "0 round-tripped" then "OK" was the only trace)."""
    decode: Optional[Callable] = None
    normalize: Optional[Callable] = None
    note: str = ""
    prefix_space: bool = False  # a ByteLevel pre-tokenizer with add_prefix_space: decode gives " " + text

    def matches(self, decoded: str, text: str) -> bool:
        """The tokens give the text back: as it is, or as the normalizer rewrote it (a Lowercase tokenizer's ids
        stand for the lower-cased text; a Prepend/Replace normalizer that its decoder undoes gives the text).
        With `prefix_space`, exactly the documented form: HF's ByteLevel pre-tokenizer prepends one space to a
        text that does not start with one, and its decoder keeps it (hostile review rv2, F4: every document of
        such a dataset failed the audit that shard had accepted)."""
        wanted = [text] if self.normalize is None else [text, self.normalize(text)]
        return any(decoded == w or (self.prefix_space and not w.startswith(" ") and decoded == " " + w)
                   for w in wanted)


def round_trip(sp, model_bytes: bytes) -> RoundTrip:
    """The check the format allows. tiktoken decodes bytes: exact. An HF tokenizer.json: exact without a
    normalizer, else against HF's own `normalizer.normalize_str` (transforms/tokenize/lossy_settings.py warns of
    such a normalizer at shard time). A SentencePiece model with the identity normalizer that keeps whitespace
    runs (its dummy prefix is removed again by decode): exact; one that normalizes is not checked (its
    normalized text escapes spaces and adds the dummy prefix, so it is no text a decode gives back), and says so."""
    from transforms.tokenize import formats, lossy_settings, references  # noqa: PLC0415

    kind = references.format_of(sp)
    if kind == formats.TIKTOKEN:
        return RoundTrip(sp.decode)
    if kind == formats.HF_JSON:
        spec = getattr(sp, "spec", {}) or {}
        prefix = lossy_settings.adds_prefix_space(spec)
        if not spec.get("normalizer"):
            return RoundTrip(sp.decode, prefix_space=prefix)
        names = lossy_settings.normalizers(spec) or ((spec["normalizer"] or {}).get("type", "?"),)
        return RoundTrip(sp.decode, sp.normalize, f"round trip checked against the text as the tokenizer's "
                                                  f"normalizer ({', '.join(map(str, names))}) rewrites it", prefix)
    from transforms.tokenize.tokenizer_backends import _spec  # noqa: PLC0415 - the proto's fields, read once

    spec = _spec(model_bytes)
    if spec["normalizer"] == "identity" and not spec["charsmap"] and not spec["remove_extra_whitespaces"]:
        return RoundTrip(sp.decode)
    what = spec["normalizer"] if spec["normalizer"] != "identity" or spec["charsmap"] else "whitespace"
    return RoundTrip(None, None, f"round trip NOT checked: the SentencePiece model normalizes text ({what}); "
                                 f"tokens were compared with a fresh tokenization only")


@dataclass(frozen=True)
class Sampled:
    where: str  # file:line
    doc_id: int
    text: str
    source: str
    want_split: Optional[str]  # the split of its --val-input / --test-input file, else None


def _removed(doc: Sampled, pieces: dict, removals: Removals, counts: collections.Counter, problems: list) -> bool:
    """True when the document is recorded as removed (and the record holds); problems for a bad record."""
    row = removals.rows.get(doc.doc_id)
    if row is None:
        return False
    reason = row.get("reason")
    if pieces.get(doc.doc_id):
        problems.append(f"{doc.where}: document {doc.doc_id:#x} is written and also recorded as removed ({reason})")
    elif reason == NEAR_DUPLICATE and not _keeper_accounted(row, pieces, removals):
        problems.append(f"{doc.where}: document {doc.doc_id:#x} was removed as a near-duplicate of "
                        f"{int(row.get('keeper', -1)):#x}, which is not in any shard")
    elif reason == CONTAMINATED and not _holds_ngram(doc.text, str(row.get("ngram", ""))):
        problems.append(f"{doc.where}: document {doc.doc_id:#x} was removed as contaminated by the n-gram "
                        f"{row.get('ngram')!r}, which its text does not hold")
    elif reason not in (NEAR_DUPLICATE, OF_COMMITTED, CONTAMINATED):
        problems.append(f"{doc.where}: document {doc.doc_id:#x} removed for an unknown reason {reason!r}")
    else:
        counts[reason] += 1
    return True


def _keeper_accounted(row: dict, pieces: dict, removals: Removals) -> bool:
    """A near-duplicate's keeper is written, or was itself dropped by its source's weight (the mixture runs after
    near-dedup, transforms/shard/pack.py pack_shard)."""
    keeper = int(row.get("keeper", -1))
    if pieces.get(keeper):
        return True
    return removals.copies(keeper, str(row.get("keeper_source", "")), None) == 0


def _holds_ngram(text: str, ngram: str) -> bool:
    from transforms.shard.near_dedup.shingling import normalised_words  # noqa: PLC0415 - as decontamination

    words, want = normalised_words(text), ngram.split()
    n = len(want)
    return n > 0 and any(words[i:i + n] == want for i in range(len(words) - n + 1))


def check_document(doc: Sampled, expected: list, pieces: dict, removals: Removals, trip: RoundTrip, eos: int,
                   counts: collections.Counter, problems: list) -> None:
    """Classify one sampled document into `counts` (written / a removal reason) or add a problem.
    `pieces`: doc_id -> [(offset, tokens, split, shard path)]; `trip`: how decode(tokens) is checked."""
    if _removed(doc, pieces, removals, counts, problems):
        return
    found = pieces.get(doc.doc_id, [])
    want_copies = removals.copies(doc.doc_id, doc.source, doc.want_split)
    if not found:
        if want_copies == 0:
            counts[DROPPED_BY_WEIGHT] += 1
        else:
            problems.append(f"{doc.where}: document {doc.doc_id:#x} is not in any shard (and not dead-lettered, "
                            "filtered or recorded as removed)")
        return
    by_offset = collections.defaultdict(list)
    for p in found:
        by_offset[p[0]].append(p)
    offsets = sorted(by_offset)
    copies = {len(v) for v in by_offset.values()}
    first = [by_offset[o][0] for o in offsets]
    starts = np.cumsum([0] + [len(p[1]) for p in first[:-1]]).tolist()
    shards = sorted({p[3] for p in found})
    if offsets != starts or len(copies) != 1:
        problems.append(f"{doc.where}: document {doc.doc_id:#x} pieces at offsets {offsets[:8]} are not whole copies "
                        f"(expected {starts[:8]}): duplicated or missing pieces in {shards}")
        return
    if copies != {want_copies}:
        problems.append(f"{doc.where}: document {doc.doc_id:#x} is written {copies.pop()} time(s); its source "
                        f"{doc.source!r} weight asks for {want_copies} in {shards}")
        return
    splits = sorted({p[2] for p in found})
    if len(splits) != 1:
        problems.append(f"{doc.where}: document {doc.doc_id:#x} is in splits {splits}")
        return
    if any(not np.array_equal(p[1], by_offset[p[0]][0][1]) for p in found):
        problems.append(f"{doc.where}: document {doc.doc_id:#x} copies differ in {shards}")
        return
    got = np.concatenate([p[1] for p in first]).tolist()
    if got != expected:
        at = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        problems.append(f"{doc.where}: document {doc.doc_id:#x} tokens differ from a fresh tokenization at token "
                        f"{at} ({len(got)} stored vs {len(expected)} expected) in {shards}")
        return
    if trip.decode is not None:
        text = trip.decode(got[:-1] if got and got[-1] == eos else got)
        if not trip.matches(text, doc.text):
            at = next((i for i, (a, b) in enumerate(zip(text, doc.text)) if a != b), min(len(text), len(doc.text)))
            problems.append(f"{doc.where}: document {doc.doc_id:#x} does not round-trip: its tokens decode to a "
                            f"different text from character {at} ({len(text)} vs {len(doc.text)} characters) in "
                            f"{shards}")
            return
        counts["round_trip_checked"] += 1
    want = doc.want_split
    if want == "val" and splits[0] not in ("val", "test") or want == "test" and splits[0] != "test":
        problems.append(f"{doc.where}: document {doc.doc_id:#x} from a --{want}-input file is in {splits[0]}")
        return
    counts["written"] += 1
