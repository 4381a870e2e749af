"""`pileprep verify --inputs GLOB --sample N`, part 2 (pipeline/tools/verify.py): the content audit.

A seeded sample of input records is re-read and, for documents, re-tokenized *independently of the shard job's
code*: plain zstandard/gzip + `json` + SentencePiece, and the document id recomputed here from its definition
(docs/DESIGN.md: a hash of the text alone). Each sampled document must then be found through the shards'
provenance features (`piece_doc_ids`, `piece_offsets`): present exactly once (one piece at each offset,
contiguous from 0), token-exact (its tokens + EOS), in one split, and in its input's split when that input was a
--val-input / --test-input, and its tokens must decode back to its text where the format's decode is exact. A
document may instead be recorded as removed (near-duplicate, contaminated, dropped by a source weight below 1):
pipeline/tools/verify_inputs.py judges each one, and checks the round trip. A record that is not a document must
be accounted for: in a dead-letter file at its file and line, or filtered (blank / empty text).
The audit reads every shard once; its memory is the sample, not the dataset.
"""
from __future__ import annotations

import collections
import fnmatch
import gzip
import hashlib
import heapq
import io
import json
import os
import struct
from typing import Optional

from model_contract import ContractError, Manifest, TFRecordCorruptError, decode_example, iter_records
from pipeline.errors import ConfigError
from pipeline.ops.input_checks import match_input, readable_inputs
from pipeline.tools import verify_inputs
from pipeline.tools.verify_files import located
from pipeline.tools.verify_report import AuditResult
from transforms.io import io_utils


def _doc_id(text: str) -> int:
    """Recomputed from the definition (docs/DESIGN.md), not imported, so a drift in the job's id is caught."""
    h = hashlib.blake2b(digest_size=8, person=b"pileprep-doc")
    h.update(text.encode("utf-8"))
    return struct.unpack("<Q", h.digest())[0] >> 1


def _lines(path: str):
    """(1-based line, bytes without terminator) of a .jsonl/.zst/.gz input; stops quietly at damage (the shard
    job dead-letters it, and damaged records are not sampled)."""
    import zstandard  # noqa: PLC0415

    raw = io_utils.open_read(path)
    name = path.lower()
    if name.endswith((".zst", ".zstd")):
        reader = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True), 1 << 20)
    elif name.endswith(".gz"):
        reader = gzip.GzipFile(fileobj=raw)
    else:
        reader = raw
    n = 0
    try:
        for line in iter(reader.readline, b""):
            n += 1
            if line.endswith(b"\n"):
                line = line[:-1]
            yield n, line[:-1] if line.endswith(b"\r") else line
    except (OSError, EOFError, zstandard.ZstdError):
        return
    finally:
        raw.close()


def _sample_key(seed: int, path: str, line: int) -> int:
    h = hashlib.blake2b(f"{seed}\0{path}\0{line}".encode(), digest_size=8, person=b"pileprep-audit")
    return int.from_bytes(h.digest(), "little")


def sample_records(paths: list, n: int, seed: int) -> list:
    """The n (path, line, bytes) records with the smallest seeded hash: a fair sample, independent of file
    order and worker count, with memory for n records."""
    heap: list = []  # max-heap by key (negated)
    for path in paths:
        for line, data in _lines(path):
            key = _sample_key(seed, path, line)
            if len(heap) < n:
                heapq.heappush(heap, (-key, path, line, data))
            elif key < -heap[0][0]:
                heapq.heapreplace(heap, (-key, path, line, data))
    return sorted((path, line, data) for _k, path, line, data in heap)


# The same walk as transforms/shard/documents.py `lookup_field`, kept apart on purpose: the audit re-reads the
# inputs without the shard job's code (this module's docstring), so a bug in the job's field lookup (a dotted
# --text-field resolved wrongly) shows as documents missing from the shards instead of being repeated here.
def _field(record, dotted: str):
    cur = record
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _document_text(data: bytes, text_field: str) -> tuple:
    """("document", text) | ("filtered", reason) | ("invalid", reason): the record read with plain json."""
    if not data.strip():
        return "filtered", "blank_line"
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return "invalid", "not parseable JSON"
    text = _field(record, text_field) if isinstance(record, dict) else None
    if not isinstance(text, str):
        return "invalid", f"no string {text_field!r}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "invalid", "lone surrogate"
    if not text.strip():
        return "filtered", "empty_text"
    return "document", text


def _dead_letters(manifest: Manifest, manifest_file: str) -> dict:
    """(file, line) -> reason over every dead-letter file."""
    out = {}
    for rel in manifest.dead_letters:
        try:
            data = io_utils.read_bytes(located(manifest_file, rel))
        except (ContractError, OSError):
            continue  # reported by the file check
        for row in data.decode("utf-8", "replace").splitlines():
            try:
                d = json.loads(row)
                out[(d["file"], int(d["line"]))] = d["reason"]
            except (ValueError, KeyError, TypeError):
                continue
    return out


def _pieces_of(manifest: Manifest, manifest_file: str, wanted: set, audit: AuditResult) -> dict:
    """doc_id -> [(offset, tokens, split, shard path)] for the wanted ids, from every shard's provenance."""
    found = collections.defaultdict(list)
    for shard in manifest.shards:
        try:
            path = located(manifest_file, shard.path)
            with io_utils.open_read(path) as f:
                for record in iter_records(f, name=shard.path):
                    ex = decode_example(record)
                    seg = ex["segment_ids"]
                    for n, (doc, off) in enumerate(zip(ex["piece_doc_ids"], ex["piece_offsets"]), start=1):
                        if int(doc) in wanted:
                            found[int(doc)].append((int(off), ex["input_ids"][seg == n], shard.split, shard.path))
        except (ContractError, OSError, TFRecordCorruptError) as e:
            audit.problems.append(f"shard {shard.path}: cannot be read for the audit ({_read_problem(e)})")
    return found


def _read_problem(e: Exception) -> str:
    """Why a file could not be read, in words: "missing", "Permission denied", or the refusal's own message; never
    Python's `[Errno 2] No such file or directory: '<path>'` (the path is already named)."""
    if isinstance(e, FileNotFoundError):
        return "missing"
    if isinstance(e, OSError):
        return e.strerror or type(e).__name__
    return str(e)


def _held_out_split(manifest: Manifest, path: str) -> Optional[str]:
    config = manifest.config
    for split, key in (("test", "test_inputs"), ("val", "val_inputs")):
        if any(fnmatch.fnmatchcase(path, g) or path == g for g in config.get(key, []) or []):
            return split
    return None


def _manifest_tokenizer_unreadable(path: str, error: str) -> str:
    """The refusal when the tokenizer named by the manifest (config.tokenizer, as typed at shard time) cannot be
    read: it names where the path came from, not --tokenizer, which the user did not pass (hostile review rv2,
    F5). A relative path is read from the current directory: the manifest does not record the directory shard
    ran in, so that is said rather than another directory guessed."""
    why = error.split(f"{path}: ", 1)[-1] if f"{path}: " in error else error
    where = ("; it is relative, and the manifest does not record the directory shard ran in: run verify there or "
             "pass --tokenizer") if not os.path.isabs(path) and io_utils.is_local(path) else "; pass --tokenizer"
    return f"the manifest's tokenizer (config.tokenizer) cannot be read at {path}: {why}{where}"


def _other_tokenizer(path: str, got: str, want: str, given: bool) -> str:
    """The refusal when the tokenizer file is not the one the dataset was built with: nothing can be audited
    against another tokenizer's ids, so this is exit 2 (pipeline/errors.py), never a FAILED audit (exit 1)."""
    where = f"--tokenizer {path}" if given else f"the manifest's tokenizer (config.tokenizer) {path}"
    return (f"{where}: sha256 {got[:12]}… is not the contract's {str(want)[:12]}… (changed since the run, or "
            f"another tokenizer); pass --tokenizer with the file the dataset was built with")


def audit_content(manifest: Manifest, manifest_file: str, input_globs: list, sample: int, seed: int,
                  tokenizer_path: Optional[str]) -> AuditResult:
    from transforms.tokenize import tokenizer  # noqa: PLC0415

    audit = AuditResult()
    model_path = tokenizer_path or manifest.config.get("tokenizer")
    try:
        model = tokenizer.read_model_bytes(model_path)  # regular file, size bound (the one tokenizer opener)
    except tokenizer.TokenizerError as e:
        if tokenizer_path:
            raise
        raise tokenizer.TokenizerError(_manifest_tokenizer_unreadable(str(model_path), str(e))) from None
    got = hashlib.sha256(model).hexdigest()
    if got != manifest.contract.tokenizer.model_sha256:  # a configuration error, not an audit result (rv2 F7)
        raise ConfigError(_other_tokenizer(str(model_path), got, manifest.contract.tokenizer.model_sha256,
                                           given=bool(tokenizer_path)))
    sp = tokenizer.load_for_info(model, manifest.contract.tokenizer, model_path)  # the format's reference library
    eos = manifest.contract.tokenizer.eos_id
    paths = sorted({m.path for g in input_globs for m in match_input(g)})
    paths = readable_inputs(paths, "--inputs", "the audit")  # never a FIFO, /dev/zero or a misnamed .bz2
    held, unmatched = verify_inputs.held_inputs(manifest, paths)  # given path -> the manifest's name for it
    audit.problems.extend(unmatched)
    records = sample_records(paths, sample, seed)
    audit.sampled = len(records)
    dead = _dead_letters(manifest, manifest_file)
    text_field = manifest.config.get("text_field", "text")
    documents = []
    source_fields = manifest.config.get("source_fields") or ["meta.pile_set_name"]
    for path, line, data in records:
        where = f"{path}:{line}"
        if path not in held:
            audit.problems.append(f"{where}: {path} is not an input of this dataset (by name, resolved path or "
                                  f"content sha256)")
            continue
        path = held[path]  # dead letters and --val/--test-input globs name the file as the manifest does
        if (path, line) in dead:
            audit.dead_lettered += 1
            continue
        kind, value = _document_text(data, text_field)
        if kind == "filtered":
            audit.filtered += 1
        elif kind == "invalid":
            audit.problems.append(f"{where}: {value}, but no dead letter names this line")
        else:
            documents.append(verify_inputs.Sampled(where, _doc_id(value), value,
                                                    verify_inputs.record_source(data, source_fields),
                                                    _held_out_split(manifest, path)))
    removals = verify_inputs.load_removals(manifest, manifest_file, audit.problems)
    ids = {d.doc_id for d in documents}
    pieces = _pieces_of(manifest, manifest_file, ids | removals.keepers(ids), audit)
    trip = verify_inputs.round_trip(sp, model)
    audit.round_trip_note = trip.note
    counts = collections.Counter()
    for doc in documents:
        expected = list(sp.encode(doc.text)) + [eos]
        verify_inputs.check_document(doc, expected, pieces, removals, trip, eos, counts, audit.problems)
    audit.documents = counts.pop("written", 0)
    audit.round_trip_checked = counts.pop("round_trip_checked", 0)
    audit.removed = dict(sorted(counts.items()))
    return audit

