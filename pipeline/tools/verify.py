"""`pileprep verify DIR`: prove a committed dataset is the one its manifest describes, and (with `--inputs`) that
it holds what its inputs say it should.

1. Files. Every shard, dead-letter file, document-id index and near-dedup band index file the manifest names is
   hashed and compared with the size and sha256 the manifest recorded (band index rows are also checked: whole
   rows, sorted, keys in the file's range); each mismatch (missing, truncated, 0-byte, flipped byte, two
   shards swapped) is listed by name. Paths go through the one resolver (`model_contract.resolve_shard_path`),
   which refuses paths outside the dataset. Local, mounted and s3:// datasets alike (Beam FileSystems).
2. Content audit (`--inputs GLOB --sample N`). A seeded sample of input records is re-read and, for documents,
   re-tokenized *independently of the shard job's code*: plain zstandard/gzip + `json` + SentencePiece, and the
   document id recomputed here from its definition (docs/DESIGN.md: a hash of the text alone). Each sampled
   document must then be found through the shards' provenance features (`piece_doc_ids`, `piece_offsets`):
   present exactly once (one piece at each offset, contiguous from 0), token-exact (its tokens + EOS), in one
   split, and in its input's split when that input was a --val-input / --test-input, and its tokens must decode
   back to its text where the format's decode is exact. A document may instead be recorded as removed
   (near-duplicate, contaminated, dropped by a source weight below 1): pipeline/tools/verify_inputs.py judges each
   one. A record that is not a document must be accounted for: in a dead-letter file at its file and line, or
   filtered (blank / empty text).
   The audit reads every shard once; its memory is the sample, not the dataset.

Library code: returns a `VerifyReport`; the CLI prints it and exits 1 unless `report.ok`.
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
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from model_contract import (MANIFEST_NAME, ContractError, Manifest, TFRecordCorruptError, decode_example,
                            iter_records, resolve_shard_path)
from model_contract.hashing import sha256_file
from model_contract.manifest import resolve_dataset_path
from pipeline.errors import ConfigError
from pipeline.ops.input_checks import match_input, readable_inputs
from pipeline.tools import verify_inputs
from transforms.io import io_utils


@dataclass
class AuditResult:
    sampled: int = 0
    documents: int = 0  # sampled records that are documents, each found once, token-exact, in one split
    dead_lettered: int = 0  # sampled records found in a dead-letter file
    filtered: int = 0  # blank lines and empty texts
    problems: list = field(default_factory=list)
    # sampled documents removed on purpose, by reason (near_duplicate, contaminated, mixture_weight, ...), and
    # how many written ones were checked by decoding (pipeline/tools/verify_inputs.py)
    removed: dict = field(default_factory=dict)
    round_trip_checked: int = 0
    round_trip_note: str = ""  # how decode(tokens) was checked, when not against the text as is, or why not


@dataclass
class VerifyReport:
    dataset: str
    files_checked: int = 0
    bytes_checked: int = 0
    mismatches: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    audit: Optional[AuditResult] = None

    @property
    def ok(self) -> bool:
        return not self.mismatches and (self.audit is None or not self.audit.problems)

    def render(self) -> str:
        from pipeline.ops.safe_text import terminal as t  # noqa: PLC0415 - paths and names are the data's

        lines = [f"verify {t(self.dataset)}: {self.files_checked} files, {self.bytes_checked} bytes checked against "
                 f"the manifest: {len(self.mismatches)} mismatch(es)"]
        lines += [f"  MISMATCH {t(m)}" for m in self.mismatches]
        lines += [f"  note: {t(n)}" for n in self.notes]
        if self.audit is not None:
            a = self.audit
            lines.append(f"audit: {a.sampled} sampled records: {a.documents} documents found once and token-exact, "
                         f"{a.dead_lettered} dead-lettered, {a.filtered} filtered, removed {a.removed or 'none'}, "
                         f"{a.round_trip_checked} round-tripped; {len(a.problems)} problem(s)")
            if a.round_trip_note:
                lines.append(f"  note: {t(a.round_trip_note)}")
            lines += [f"  PROBLEM {t(p)}" for p in a.problems]
        lines.append("OK" if self.ok else "FAILED")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- files
def _digest(path: str) -> tuple:
    return sha256_file(path, opener=io_utils.open_read)  # the shared hash, not the job's reader


def _located(manifest_file: str, rel: str) -> str:
    return resolve_dataset_path(manifest_file, rel)


def _expected_files(manifest: Manifest, report: VerifyReport) -> list:
    """(kind, relative path, bytes, sha256) of every file the manifest names."""
    files = [("shard", s.path, s.bytes, s.sha256) for s in manifest.shards]
    recorded = {r.path: r for r in manifest.dead_letter_files or []}
    for rel in manifest.dead_letters:
        row = recorded.get(rel)
        if row is None:
            report.notes.append(f"dead letter {rel}: no size/sha256 recorded (manifest predates them); "
                                "checked that it exists")
            files.append(("dead letter", rel, None, None))
        else:
            files.append(("dead letter", rel, row.bytes, row.sha256))
    files += [("id index", r.path, r.bytes, r.sha256) for r in manifest.doc_id_indexes or []]
    return files


def check_files(manifest: Manifest, manifest_file: str, report: VerifyReport) -> None:
    check_band_indexes(manifest, manifest_file, report)
    for kind, rel, size, sha in _expected_files(manifest, report):
        try:
            path = _located(manifest_file, rel)
        except ContractError as e:
            report.mismatches.append(f"{kind} {rel}: refused: {e}")
            continue
        try:  # no separate existence check: on object stores each call costs a client and a request
            got_size, got_sha = _digest(path)
        except Exception as e:  # noqa: BLE001 - FileNotFoundError locally, BeamIOError & co on object stores
            report.mismatches.append(f"{kind} {rel}: missing or unreadable ({type(e).__name__})")
            continue
        report.files_checked += 1
        report.bytes_checked += got_size
        if size is not None and got_size != size:
            report.mismatches.append(f"{kind} {rel}: {got_size} bytes, the manifest says {size}")
        elif sha is not None and got_sha != sha:
            report.mismatches.append(f"{kind} {rel}: sha256 {got_sha[:16]}…, the manifest says {sha[:16]}… "
                                     "(same size: flipped bytes or a swapped file)")


# ------------------------------------------------------------------------------------ near-dedup band index
BAND_INDEXES = "near_dedup_band_indexes"  # the manifest's list (pipeline/shard/near_dedup/manifest.py BAND_INDEXES)
_BAND_CHUNK_ROWS = 4096  # rows read at a time: a Pile-scale band file is tens of GB, never read whole


def _num_perm(manifest: Manifest) -> Optional[int]:
    """MinHash values per row: bands x rows of the config that built the dataset (an incremental run keeps the
    committed config, so every generation's files share it)."""
    cfg = manifest.config or {}
    minhash = (manifest.extra.get("near_dedup") or {}).get("minhash") or {}
    bands, rows = cfg.get("near_dedup_bands", minhash.get("bands")), cfg.get("near_dedup_rows", minhash.get("rows"))
    ok = isinstance(bands, int) and isinstance(rows, int) and bands > 0 and rows > 0
    return bands * rows if ok else None


def _band_rows_problem(rows: np.ndarray, first: int, previous: Optional[tuple], key_range: int,
                       ranges: int) -> Optional[str]:
    """The first malformed row of a chunk, as the incremental run's reader would refuse or misuse it
    (transforms/shard/near_dedup/band_index.py decode, pipeline/shard/near_dedup/windows.py committed_range_rows):
    keys of 63 bits in the file's range (the top 3 bits, band_index.py BAND_RANGES), (key, id) strictly
    increasing across the whole file, a split the contract knows."""
    from transforms.shard.documents import SPLITS  # noqa: PLC0415

    keys, ids, splits = rows["key"], rows["doc_id"], rows["split"]
    shift = np.uint64(63 - (ranges.bit_length() - 1))  # a key's range = key * ranges >> 63, ranges a power of 2
    outside = np.flatnonzero((keys >> shift) != np.uint64(key_range))
    if outside.size:
        return f"row {first + int(outside[0])}: band key {int(keys[outside[0]]):#x} outside range {key_range}"
    if previous is not None and (int(keys[0]), int(ids[0])) <= previous:
        return f"row {first}: not sorted by (band key, document id) after the previous row"
    later = (keys[1:] > keys[:-1]) | ((keys[1:] == keys[:-1]) & (ids[1:] > ids[:-1]))
    if not later.all():
        return f"row {first + 1 + int(np.flatnonzero(~later)[0])}: not sorted by (band key, document id)"
    bad_split = np.flatnonzero(splits >= len(SPLITS))
    if bad_split.size:
        return f"row {first + int(bad_split[0])}: split {int(splits[bad_split[0]])} is not one of {len(SPLITS)}"
    return None


def _scan_band_file(path: str, num_perm: Optional[int], key_range: int, ranges: int) -> tuple:
    """(bytes, sha256, first problem with the rows or None) in one streaming pass over the file."""
    from transforms.shard.near_dedup.band_index import row_dtype  # noqa: PLC0415

    dtype = row_dtype(num_perm) if num_perm else None
    h, size, pending, first, previous, problem = hashlib.sha256(), 0, b"", 0, None, None
    with io_utils.open_read(path) as f:
        while True:
            chunk = f.read((dtype.itemsize if dtype else 1) * _BAND_CHUNK_ROWS)
            if not chunk:
                break
            h.update(chunk)
            size += len(chunk)
            if dtype is None or problem is not None:
                continue
            pending += chunk
            whole = len(pending) - len(pending) % dtype.itemsize
            rows = np.frombuffer(pending[:whole], dtype=dtype)
            pending = pending[whole:]
            if rows.size:
                problem = _band_rows_problem(rows, first, previous, key_range, ranges)
                previous, first = (int(rows["key"][-1]), int(rows["doc_id"][-1])), first + rows.size
    if problem is None and dtype is not None and pending:
        problem = (f"{size} bytes is not a whole number of {dtype.itemsize}-byte rows (a band index of "
                   f"{num_perm} permutations)")
    return size, h.hexdigest(), problem


def check_band_indexes(manifest: Manifest, manifest_file: str, report: VerifyReport) -> None:
    """Every near-dedup band index file the manifest lists: size and sha256 as listed, then its rows well formed.
    A later `--incremental --near-dedup` run trusts these rows to keep near-copies of committed documents out;
    it checks them only when it reads them, so a damaged file would otherwise surface mid-run."""
    listed = manifest.band_indexes or []  # rows already checked field by field on load (model_contract/manifest.py)
    if not listed:
        return
    from transforms.shard.near_dedup.band_index import BAND_RANGES  # noqa: PLC0415

    num_perm = _num_perm(manifest)
    if num_perm is None:
        report.notes.append(f"{BAND_INDEXES}: the manifest names no near_dedup_bands / near_dedup_rows; band index "
                            "files checked by size and sha256 only")
    for i, row in enumerate(listed):
        rel, size, sha, key_range = row.path, row.bytes, row.sha256, row.range
        if not 0 <= key_range < BAND_RANGES:
            report.mismatches.append(f"band index {BAND_INDEXES}[{i}]: range {key_range} is not 0-{BAND_RANGES - 1}")
            continue
        try:
            path = _located(manifest_file, rel)
        except ContractError as e:
            report.mismatches.append(f"band index {rel}: refused: {e}")
            continue
        try:
            got_size, got_sha, problem = _scan_band_file(path, num_perm, key_range, BAND_RANGES)
        except Exception as e:  # noqa: BLE001 - FileNotFoundError locally, BeamIOError & co on object stores
            report.mismatches.append(f"band index {rel}: missing or unreadable ({type(e).__name__})")
            continue
        report.files_checked += 1
        report.bytes_checked += got_size
        if got_size != size:
            report.mismatches.append(f"band index {rel}: {got_size} bytes, the manifest says {size}")
        elif got_sha != sha:
            report.mismatches.append(f"band index {rel}: sha256 {got_sha[:16]}…, the manifest says {sha[:16]}… "
                                     "(same size: flipped bytes or a swapped file)")
        elif problem is not None:
            report.mismatches.append(f"band index {rel}: {problem}")


# ------------------------------------------------------------------------------------------------- audit
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
            data = io_utils.read_bytes(_located(manifest_file, rel))
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
            path = _located(manifest_file, shard.path)
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


# --------------------------------------------------------------------------------------------------- entry
def verify(dataset: str, inputs: Optional[list] = None, sample: int = 200, seed: int = 0,
           tokenizer_path: Optional[str] = None, filesystem_args: Optional[list] = None) -> VerifyReport:
    """Check `dataset` (a directory or prefix holding manifest.json); see the module doc."""
    from apache_beam.options.pipeline_options import PipelineOptions  # noqa: PLC0415

    from transforms.io.filesystem_options import set_filesystem_options  # noqa: PLC0415

    if filesystem_args:
        set_filesystem_options(PipelineOptions(list(filesystem_args)))
    report = VerifyReport(dataset)
    manifest_file = dataset if dataset.endswith(".json") else io_utils.join(dataset, MANIFEST_NAME)
    if io_utils.is_local(dataset) and not dataset.endswith(".json"):
        from pipeline.tools import export_verify  # noqa: PLC0415

        if export_verify.is_export(dataset):  # an export's files against its export.json
            export_verify.verify_export(dataset, report)  # (a link there is a mismatch it names)
            return report
    if io_utils.is_local(manifest_file):  # before any read: never through a link inside the dataset
        from pipeline.ops import guards  # noqa: PLC0415

        guards.check_no_links_inside(os.path.dirname(manifest_file) or ".", "verify")
    if not io_utils.exists(manifest_file):
        report.mismatches.append(f"{manifest_file}: no manifest (never committed, or not a dataset)")
        return report
    try:  # a manifest that fails its schema is a ContractError: one line, exit 2 (pipeline/errors.py)
        from pipeline.ops import commit  # noqa: PLC0415

        manifest = commit.parse_manifest(io_utils.read_bytes(manifest_file).decode("utf-8"), dataset)
    except UnicodeDecodeError as e:
        report.mismatches.append(f"{manifest_file}: damaged manifest: {e}")
        return report
    check_files(manifest, manifest_file, report)
    if inputs:
        report.audit = audit_content(manifest, manifest_file, list(inputs), sample, seed, tokenizer_path)
    return report
