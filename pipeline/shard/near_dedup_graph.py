"""The near-dedup and decontamination stage of the shard job, between tokenize and pack (Beam wiring).

    units ─ SignUnit ─┬─ band keys ─ GroupByKey ─ star edges [─ verify] ─ adjacency ─ R label rounds ─┐
                      └─ contaminated rows ──────────────────────────────────────────────── removals ─┤
                                                             GroupByKey by id partition: write indexes ┘
    then a barrier: the units pass on only once the removal indexes are staged (packing reads them).

The logic is in transforms/shard/near_dedup.py and decontaminate.py; the packers' lookup in
transforms/shard/near_dedup_removals.py. Candidate pairs meet in the runner's own GroupByKey on band keys (no
driver-side table); the union-find is label propagation over a fixed number of rounds unrolled into the graph
(`--near-dedup-rounds`), each one GroupByKey, so no process holds more than one bucket or one node's
neighbours. Elements are small (a Node: ids, split, a 400-byte signature). Every name and every choice depends
only on the data, never on placement or arrival order, so the output is the same bytes on every runner.
"""
from __future__ import annotations

import collections
import hashlib
import json
import logging
import pickle
import typing

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from pipeline.errors import ConfigError, RunError
from pipeline.ops.input_checks import match_input
from pipeline.shard import integrity, markers
from pipeline.shard.near_dedup_manifest import BAND_INDEXES, SUMMARY_NAME
from pipeline.shard.near_dedup_settings import params_of, tokenize_signing
from transforms.io import io_utils, read_parquet
from transforms.io.read_records import RawRecord, compression_of, iter_raw_records
from transforms.shard import decontaminate, doc_ids, layout, near_dedup, tokenize_unit
from transforms.shard import near_dedup_band_index as band_index
from transforms.shard import near_dedup_removals as removals
from transforms.shard.documents import SPLIT_SHIFT, SPLITS, Document, parse_record
from transforms.shard.spill import INDEX_DTYPE, iter_chunk, read_index_rows

LOG = logging.getLogger("pileprep.near_dedup")
SIGN_BATCH_CHARS = 1 << 20
EXCERPT_CHARS = 400
EXAMPLE_PAIRS = 3
SIDECAR_DIR = "near-dedup"


def _distinct_rows(plan, unit) -> np.ndarray:
    """Index rows of a unit's distinct documents, in line order: per id the copy in the highest split (exact
    dedup keeps that one), the first line among equals. Exact copies of committed documents take no part (the
    packers drop them as duplicates). The one rule every way of signing a unit follows."""
    if unit.n_docs == 0:
        return np.zeros(0, dtype=INDEX_DTYPE)
    with io_utils.open_read(unit.index_path) as f:
        rows = read_index_rows(f, 0, unit.n_docs)
    held = np.zeros(rows.size, dtype=bool)
    for path in getattr(plan, "committed_id_indexes", ()):
        held |= doc_ids.IdIndex(path).contains(rows["doc_id"])
    rows = rows[~held]
    rows = rows[np.argsort(rows["line"], kind="stable")]
    best: dict = {}
    for i, (doc_id, split) in enumerate(zip(rows["doc_id"].tolist(),
                                            (rows["key"] >> np.uint64(SPLIT_SHIFT)).tolist())):
        cur = best.get(doc_id)
        if cur is None or split > cur[0]:
            best[doc_id] = (split, i)
    return rows[np.sort(np.array([i for _split, i in best.values()], dtype=np.int64))]


def _row_fields(unit, r) -> tuple:
    """(line, doc_id, split, source) of one index row."""
    return (int(r["line"]), int(r["doc_id"]), int(r["key"] >> np.uint64(SPLIT_SHIFT)),
            unit.sources[int(r["source_idx"])])


def _staged_signatures(plan, unit, num_perm: int):
    """(docs [(doc_id, split, source, loc)], signatures) of a unit's distinct documents (`_distinct_rows`), in
    line order, from the signatures its tokenize stage staged (`tokenize_signing`): the same documents and
    values as signing their text here. None when the file is missing or does not hold one row per indexed
    document (a unit staged by a run that signed nothing): the caller then reads the text."""
    path = layout.Layout(plan.staging_dir, plan.data_dir).path(layout.unit_signatures(unit.name))
    dtype = tokenize_unit.unit_signatures_dtype(num_perm)
    if unit.n_docs == 0:
        return [], np.zeros((0, num_perm), dtype=near_dedup.SIGNATURE_DTYPE)
    if not io_utils.exists(path):
        return None
    data = io_utils.read_bytes(path)
    if len(data) != unit.n_docs * dtype.itemsize:
        return None
    staged = np.frombuffer(data, dtype=dtype)
    by_line = np.argsort(staged["line"], kind="stable")
    lines = staged["line"][by_line]
    chosen = [_row_fields(unit, r) for r in _distinct_rows(plan, unit)]
    want = np.array([c[0] for c in chosen], dtype=np.uint64)
    at = np.minimum(np.searchsorted(lines, want), max(lines.size - 1, 0))
    if lines.size == 0 or not np.array_equal(lines[at], want):
        raise IOError(f"{unit.name}: staged near-dedup signatures do not match its index (staging damaged)")
    sigs = staged["sig"][by_line[at]]
    return [(doc_id, split, source, (unit.name, line)) for line, doc_id, split, source in chosen], sigs


def eval_files(config) -> list:
    """The evaluation files --decontaminate names, sorted; a glob matching nothing is a configuration error."""
    files = set()
    for pattern in config.decontaminate:
        matched = [m.path for m in match_input(pattern)]
        if not matched:
            raise ConfigError(f"--decontaminate: {pattern} matches no file")
        files.update(matched)
    return sorted(files)


def _eval_texts(path: str, field: str):
    with io_utils.open_read(path) as f:
        items = (read_parquet.iter_parquet_records(f, field, (), 1 << 30) if read_parquet.is_parquet(path)
                 else iter_raw_records(f, compression_of(path), 1 << 30))
        for item in items:
            if not isinstance(item, RawRecord):
                raise RunError(f"--decontaminate: {path} line {item.line}: {item.reason}")
            yield from decontaminate.iter_eval_texts(path, item.data, field)


def load_eval_set(config, files: list) -> decontaminate.EvalSet:
    return decontaminate.build_eval_set([(p, list(_eval_texts(p, config.decontaminate_field))) for p in files],
                                        config.decontaminate_ngram)


def shingle_path(staging_dir: str, unit_name: str) -> str:
    return io_utils.join(staging_dir, "near-dedup", "shingles", unit_name + ".u64")


def _unit_documents(plan, unit, text: bool = True):
    """(line, doc_id, split, source, text or token ids) of each distinct document of a unit (`_distinct_rows`),
    in line order. `text=False`: the document's token ids from the tokenize stage's spill (transforms/shard/
    spill.py layout), not its text: no second read and parse of the unit's chunk (--near-dedup-shingles tokens;
    --decontaminate still reads the text)."""
    rows = _distinct_rows(plan, unit)
    if not rows.size:
        return []
    if not text:
        tokens = np.frombuffer(io_utils.read_bytes(unit.tokens_path), dtype=np.dtype(unit.token_dtype))
        return [(*_row_fields(unit, r), tokens[int(r["token_start"]):int(r["token_start"]) + int(r["n_tokens"])])
                for r in rows]
    by_line = {line: (doc_id, split) for line, doc_id, split, _source in (_row_fields(unit, r) for r in rows)}
    cfg = plan.config
    out = []
    with io_utils.open_read(layout.Layout(plan.staging_dir, plan.data_dir).path(layout.chunk_file(unit.name))) as f:
        for line, data in iter_chunk(f):
            if line not in by_line:
                continue
            doc = parse_record(data, cfg.text_field, tuple(cfg.source_fields))
            doc_id, split = by_line[line]
            if not isinstance(doc, Document) or doc.doc_id != doc_id:
                raise IOError(f"{unit.name}: line {line} does not hold document {doc_id} (staging damaged)")
            out.append((line, doc_id, split, doc.source, doc.text))
    return out


class SignUnit(beam.DoFn):
    """One unit's documents → ('band', key, Node) per band, or ('removal', id, row) for a contaminated one."""

    def __init__(self, plan, eval_paths: tuple, shuffle: str = "runner"):
        self.plan = plan
        self.eval_paths = eval_paths
        self.shuffle = shuffle

    def setup(self):
        self.plan.setup_worker()
        cfg = self.plan.config
        self.params = params_of(cfg)
        self.coefficients = self.params.coefficients()
        self.eval_set = load_eval_set(cfg, list(self.eval_paths)) if self.eval_paths else None
        self.checked_splits = contaminated_splits(cfg)

    def process(self, unit):
        # files: the band rows go to staged files and only the unit's name travels on (FnApiRunner holds a
        # stage's whole output in memory, and with worker threads or processes failed to decode a bundle's
        # output above ~10 MB: "Invalid PaneInfoEncoding", measured on 1,925 documents). Both shuffles stage
        # them: the generation's band index is written from them once the removals are known. The rows stay
        # numpy arrays (one per unit, not ten Python elements per document): pickling a Node per band row
        # and sorting them in Python was most of the stage's cost on distinct text (docs/NEAR_DEDUP.md "Cost").
        docs, sigs, keys, others = [], [], [], []
        for e in self._process(unit):
            if e[0] == "signed":
                docs += e[1]
                sigs.append(e[2])
                keys.append(e[3])
            else:
                others.append(e)
        if self.plan.config.near_dedup:
            num_perm, bands = self.params.num_perm, self.params.bands
            sigs = np.concatenate(sigs) if sigs else np.zeros((0, num_perm), dtype=near_dedup.SIGNATURE_DTYPE)
            keys = np.concatenate(keys) if keys else np.zeros((0, bands), dtype=np.uint64)
            write_band_files(self.plan.staging_dir, unit.name, docs, sigs, keys)
            yield ("bands", unit.name, None)
            if self.shuffle != "files":
                for (doc_id, split, source, loc), sig, ks in zip(docs, sigs, keys):
                    node = near_dedup.Node(near_dedup.rank(split, doc_id), doc_id, split, sig.tobytes(), source, loc)
                    for k in ks.tolist():
                        yield ("band", k, node)
        yield from others

    def _process(self, unit):
        cfg = self.plan.config
        batch: list = []
        chars = 0
        shingle_file = None
        if cfg.near_dedup and cfg.near_dedup_verify:
            shingle_file = io_utils.open_write(shingle_path(self.plan.staging_dir, unit.name)).__enter__()
        staged = [shingle_file, 0]  # the unit's shingle file and the shingles written to it so far
        try:
            staged_sigs = (_staged_signatures(self.plan, unit, self.params.num_perm)
                           if tokenize_signing(cfg) is not None else None)
            if staged_sigs is not None:  # signed by the tokenize stage: no text to read here
                docs, sigs = staged_sigs
                if docs:
                    yield ("signed", docs, sigs, near_dedup.band_keys(sigs, self.params) >> np.uint64(1))
                return
            tokens = cfg.near_dedup and self.params.shingles == "tokens"
            # token shingles need no text; decontamination still does (word n-grams of the text)
            text_docs = _unit_documents(self.plan, unit) if self.eval_set is not None or not tokens else None
            id_docs = _unit_documents(self.plan, unit, text=False) if tokens else None
            # `is not None`: a unit whose documents are all exact copies of committed ones (or a unit without a
            # document) has an empty list here, which `or` turned into None (TypeError)
            unit_docs = text_docs if text_docs is not None else id_docs
            for k, (line, doc_id, split, source, text) in enumerate(unit_docs):
                if self.eval_set is not None and split in self.checked_splits:
                    hit = decontaminate.find(text, self.eval_set)
                    if hit is not None:
                        yield ("removal", doc_id, {"id": doc_id, "reason": removals.CONTAMINATED, "source": source,
                                                   "eval_file": hit.eval_file, "ngram": hit.ngram})
                        continue
                if not cfg.near_dedup:
                    continue
                content = id_docs[k][4] if tokens else text  # the same documents in the same order either way
                batch.append((doc_id, split, source, line, content))
                chars += len(content) * (4 if tokens else 1)  # batches of ~ the same text either way
                if chars >= SIGN_BATCH_CHARS:
                    yield from self._sign(unit, batch, staged)
                    batch, chars = [], 0
            yield from self._sign(unit, batch, staged)
        finally:
            if shingle_file is not None:
                shingle_file.__exit__(None, None, None)

    def _sign(self, unit, batch, staged):
        """('signed', [(doc_id, split, source, loc)], signatures, band keys) of one batch of documents; their
        shingles are computed together (near_dedup.shingles_batch) and, for --near-dedup-verify, staged."""
        if not batch:
            return
        if self.params.shingles == "tokens":  # unsorted windows suffice for signatures (near_dedup.py)
            sets = near_dedup.token_shingles_batch([b[4] for b in batch], near_dedup.SHINGLE_TOKENS,
                                                   unique=staged[0] is not None)
        elif staged[0] is None:  # nothing to stage: signatures straight from the texts (C when built, no sort)
            sigs = near_dedup.word_signatures([b[4] for b in batch], self.params, self.coefficients)
            docs = [(doc_id, split, source, (unit.name, line)) for doc_id, split, source, line, _t in batch]
            yield ("signed", docs, sigs, near_dedup.band_keys(sigs, self.params) >> np.uint64(1))
            return
        else:
            sets = near_dedup.shingles_batch([b[4] for b in batch], self.params.shingle_words)
        docs = []
        for (doc_id, split, source, line, _text), sh in zip(batch, sets):
            loc = (unit.name, line)
            if staged[0] is not None:
                staged[0].write(sh.astype("<u8").tobytes())
                loc = (unit.name, line, staged[1], int(sh.size))
                staged[1] += int(sh.size)
            docs.append((doc_id, split, source, loc))
        sigs = near_dedup.signatures(sets, self.params, self.coefficients)
        keys = near_dedup.band_keys(sigs, self.params) >> np.uint64(1)  # 63 bits: Beam's int coder is signed
        yield ("signed", docs, sigs, keys)


BAND_RANGES = 8  # files shuffle: band keys are cut into this many ranges (top bits), one task each
# A staged band row: the key, the document's id and split, and its row in the unit's staged signatures.
BAND_ROW = np.dtype([("key", "<u8"), ("doc_id", "<u8"), ("split", "u1"), ("doc", "<u4")])


def band_file_path(staging_dir: str, unit_name: str, r: int) -> str:
    return io_utils.join(staging_dir, "near-dedup", "bands", f"{unit_name}-r{r:02d}.rows")


def unit_sigs_path(staging_dir: str, unit_name: str) -> str:
    return io_utils.join(staging_dir, "near-dedup", "bands", f"{unit_name}.sigs")


def unit_docs_path(staging_dir: str, unit_name: str) -> str:
    return io_utils.join(staging_dir, "near-dedup", "bands", f"{unit_name}.docs.pickle")


def window_offsets_path(staging_dir: str, unit_name: str) -> str:
    """A unit's window offsets: per key range, (WINDOW_GRAIN + 1) little-endian uint32, the row of its range file
    where each fine window of keys starts (the last: the file's row count). A key-range task reads one range's
    row of them (16 kB) and then each window's slice of the range file by a ranged read."""
    return io_utils.join(staging_dir, "near-dedup", "bands", f"{unit_name}.windows")


# Bounded memory (docs/NEAR_DEDUP.md "Memory, files shuffle"): a key-range task holds at most about WINDOW_ROWS
# band rows at once. Each range's keys are cut into WINDOW_GRAIN fine windows of equal key width (keys are
# uniform 63-bit hashes); the task groups consecutive fine windows into windows of at most WINDOW_ROWS rows (a
# fine window alone may exceed it: a hot key, or a corpus over ~WINDOW_GRAIN x WINDOW_ROWS x BAND_RANGES band
# rows) and works window by window, in key order. A band bucket is one key, so it never spans two windows: the
# same buckets, edges and band index bytes as one window per range. The band index holds ~417 bytes per row of
# a window (its signature), so 1M rows is ~0.4 GB of output rows at a time (plus the rows and their signatures).
WINDOW_ROWS = 1 << 20
WINDOW_GRAIN = 4096  # fine windows per key range; the unit stage writes their offsets, tasks group them


def _fine_bounds() -> np.ndarray:
    """The lowest key of every fine window of every range, and 2^63 last: BAND_RANGES x WINDOW_GRAIN + 1."""
    total = BAND_RANGES * WINDOW_GRAIN
    shift = 63 - (total.bit_length() - 1)
    return np.arange(total + 1, dtype=np.uint64) << np.uint64(shift)


def write_band_files(staging_dir: str, unit_name: str, docs: list, sigs: np.ndarray, keys: np.ndarray) -> None:
    """A unit's band rows, one file per key range, each sorted by (key, row), plus the unit's signatures (once
    per document, not once per band row), its documents' (source, location), read only for documents that
    share a bucket, and its window offsets (`window_offsets_path`). A retried bundle rewrites the same bytes.
    Per range, so that each key-range task reads only its own rows (the edges and the band index read them
    2 x BAND_RANGES times), and only a window of them at a time."""
    n, bands = keys.shape[0], keys.shape[1] if keys.ndim == 2 else 0
    rows = np.zeros(n * bands, dtype=BAND_ROW)
    rows["key"] = keys.reshape(-1)
    rows["doc"] = np.repeat(np.arange(n, dtype=np.uint32), bands)
    rows["doc_id"] = np.repeat(np.array([d[0] for d in docs], dtype=np.uint64), bands)
    rows["split"] = np.repeat(np.array([d[1] for d in docs], dtype=np.uint8), bands)
    rows = rows[np.lexsort((rows["doc"], rows["key"]))]
    ranges = (rows["key"] >> np.uint64(63 - (BAND_RANGES.bit_length() - 1))).astype(np.int64)  # the key's top bits
    cuts = np.searchsorted(ranges, np.arange(BAND_RANGES + 1))
    # the first row at or above each fine window's lowest key, relative to its range file's first row
    at = np.searchsorted(rows["key"], _fine_bounds()).reshape(-1)
    offsets = np.stack([at[r * WINDOW_GRAIN:(r + 1) * WINDOW_GRAIN + 1] - cuts[r] for r in range(BAND_RANGES)])
    if offsets.size and int(offsets.max()) >= 1 << 32:
        raise RunError(f"{unit_name}: over 2^32 band rows in one key range (split the input into smaller units)")
    io_utils.write_bytes(unit_sigs_path(staging_dir, unit_name), np.ascontiguousarray(sigs, "<u4").tobytes())
    io_utils.write_bytes(unit_docs_path(staging_dir, unit_name),
                         pickle.dumps([(source, loc) for _i, _s, source, loc in docs], protocol=4))
    io_utils.write_bytes(window_offsets_path(staging_dir, unit_name), offsets.astype("<u4").tobytes())
    for r in range(BAND_RANGES):
        io_utils.write_bytes(band_file_path(staging_dir, unit_name, r), rows[cuts[r]:cuts[r + 1]].tobytes())


def _unit_offsets(plan, name: str, r: int) -> np.ndarray:
    """Range r's fine window offsets of one unit (`window_offsets_path`): WINDOW_GRAIN + 1 rows, int64."""
    width = (WINDOW_GRAIN + 1) * 4
    with io_utils.open_read(window_offsets_path(plan.staging_dir, name)) as f:
        f.seek(r * width)
        data = f.read(width)
    if len(data) != width:
        raise IOError(f"{name}: near-dedup window offsets cut short (staging damaged)")
    return np.frombuffer(data, dtype="<u4").astype(np.int64)


def _read_rows(path: str, start: int, stop: int, dtype: np.dtype) -> np.ndarray:
    """Rows [start, stop) of a file of fixed-size rows, by one ranged read."""
    if stop <= start:
        return np.zeros(0, dtype=dtype)
    with io_utils.open_read(path) as f:
        f.seek(start * dtype.itemsize)
        data = f.read((stop - start) * dtype.itemsize)
    if len(data) != (stop - start) * dtype.itemsize:
        raise IOError(f"{path}: cut short at row {start + len(data) // dtype.itemsize} of {stop} (staging damaged)")
    return np.frombuffer(data, dtype=dtype)


def _window_cuts(counts: np.ndarray, cap: int) -> list:
    """Fine window indices where windows start, and WINDOW_GRAIN last: consecutive fine windows grouped while
    their rows stay within `cap` (a fine window over it stands alone)."""
    cuts, held = [0], 0
    for i, n in enumerate(counts.tolist()):
        if held and held + n > cap:
            cuts.append(i)
            held = 0
        held += n
    cuts.append(len(counts))
    return cuts


def _committed_bound(f, n: int, row_size: int, key: int) -> int:
    """The first row of an open committed band index file (n rows sorted by key) whose key is >= key: a binary
    search by ranged reads of the rows' keys."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        f.seek(mid * row_size)
        data = f.read(8)
        if len(data) != 8:
            raise ValueError(f"cut short at row {mid}")
        if int.from_bytes(data, "little") < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _committed_checked(entry: dict, num_perm: int) -> int:
    """A committed band index file's row count, once its size and sha256 (streamed, not held) match its manifest
    row: band_index.checked_bytes without the whole file in memory."""
    what = f"{BAND_INDEXES} {entry['rel']}"
    sha, size = hashlib.sha256(), 0
    with io_utils.open_read(entry["path"]) as f:
        while True:
            block = f.read(1 << 24)
            if not block:
                break
            sha.update(block)
            size += len(block)
    if size != int(entry["bytes"]) or sha.hexdigest() != entry["sha256"]:
        raise ValueError(f"{what}: {size} bytes, sha256 {sha.hexdigest()[:12]}..., but the manifest lists "
                         f"{entry['bytes']} bytes, sha256 {str(entry['sha256'])[:12]}...")
    item = band_index.row_dtype(num_perm).itemsize
    if size % item:
        raise ValueError(f"{what}: {size} bytes is not a whole number of {item}-byte rows "
                         f"(a band index of {num_perm} permutations)")
    return size // item


def _unusable(e) -> RunError:
    return RunError(f"--incremental --near-dedup: committed band index unusable: {e}; rebuild the dataset "
                    "without --incremental")


class _RangeWindows:
    """Key range r of a files-shuffle task, cut into windows of at most ~WINDOW_ROWS band rows (see WINDOW_ROWS):
    `windows()` yields, in key order, [(unit name, its staged band rows in the window)] (name order) and
    [(band key, committed Node)] of the committed generations' band index files of range r in the window. Held
    at once: one window's rows, and per unit its window boundaries (units x windows offsets)."""

    def __init__(self, plan, r: int, unit_names, committed: tuple = (), num_perm: int = 0):
        self.plan, self.r, self.names = plan, r, sorted(unit_names)
        self.num_perm = num_perm
        self.committed = []
        try:
            for entry in committed:
                if entry["range"] == r:
                    self.committed.append((entry, _committed_checked(entry, num_perm)))
        except (OSError, ValueError) as e:
            raise _unusable(e) from None
        counts = np.zeros(WINDOW_GRAIN, dtype=np.int64)
        for name in self.names:
            counts += np.diff(_unit_offsets(plan, name, r))
        for _entry, n in self.committed:  # not read yet: counted as spread evenly (uniform keys)
            counts += -(-n // WINDOW_GRAIN)
        self.cuts = _window_cuts(counts, WINDOW_ROWS)
        self.offsets = [_unit_offsets(plan, name, r)[self.cuts].astype(np.uint32) for name in self.names]
        bounds = _fine_bounds()[r * WINDOW_GRAIN:(r + 1) * WINDOW_GRAIN + 1]
        self.keys = [int(k) for k in bounds[self.cuts]]  # window w: keys [keys[w], keys[w + 1])

    def __len__(self) -> int:
        return len(self.cuts) - 1

    def windows(self):
        committed_at = self._committed_bounds()
        for w in range(len(self)):
            lo, hi = self.keys[w], self.keys[w + 1]
            parts = []
            for name, off in zip(self.names, self.offsets):
                a = _read_rows(band_file_path(self.plan.staging_dir, name, self.r), int(off[w]), int(off[w + 1]),
                               BAND_ROW)
                if a.size and (int(a["key"][0]) < lo or int(a["key"][-1]) >= hi):
                    raise IOError(f"{name}: band rows of range {self.r} out of their window (staging damaged)")
                parts.append((name, a))
            yield parts, self._committed_rows(w, committed_at)

    def _committed_bounds(self) -> list:
        out = []
        row_size = band_index.row_dtype(self.num_perm).itemsize
        for entry, n in self.committed:
            try:
                with io_utils.open_read(entry["path"]) as f:
                    at = [_committed_bound(f, n, row_size, k) for k in self.keys]
            except (OSError, ValueError) as e:
                raise _unusable(f"{BAND_INDEXES} {entry['rel']}: {e}") from None
            if at[0] != 0 or at[-1] != n:
                raise RunError(f"--incremental --near-dedup: {BAND_INDEXES} {entry['rel']} holds keys outside its "
                               f"range {entry['range']}")
            out.append(at)
        return out

    def _committed_rows(self, w: int, committed_at: list) -> list:
        out = []
        dtype = band_index.row_dtype(self.num_perm)
        for (entry, _n), at in zip(self.committed, committed_at):
            what = f"{BAND_INDEXES} {entry['rel']}"
            try:
                data = _read_rows(entry["path"], at[w], at[w + 1], dtype).tobytes()
                rows = band_index.decode(data, self.num_perm, what)
                if rows.size and (int(rows["key"][0]) < self.keys[w] or int(rows["key"][-1]) >= self.keys[w + 1]):
                    raise ValueError(f"{what}: rows are not sorted by band key")
            except (OSError, ValueError) as e:
                raise _unusable(e) from None
            out += band_index.committed_nodes(rows, entry["generation"])
        return out


def _range_rows(plan, r: int, unit_names) -> list:
    """[(unit name, staged band rows of key range r)] of every unit, in name order (the whole range at once:
    for tests and tools; the tasks read it window by window, _RangeWindows)."""
    return [(name, np.frombuffer(io_utils.read_bytes(band_file_path(plan.staging_dir, name, r)), dtype=BAND_ROW))
            for name in sorted(unit_names)]


def _unit_sigs(plan, name: str) -> np.ndarray:
    num_perm = params_of(plan.config).num_perm
    return np.frombuffer(io_utils.read_bytes(unit_sigs_path(plan.staging_dir, name)),
                         dtype=near_dedup.SIGNATURE_DTYPE).reshape(-1, num_perm)


def _unit_sig_rows(plan, name: str, docs: np.ndarray) -> np.ndarray:
    """The signatures of rows `docs` of a unit's staged signature table. Local paths (EFS/FSx too) are mapped,
    so only the pages of those rows are read and nothing but the rows is held; elsewhere the table is read
    (bounded by a unit's size)."""
    num_perm = params_of(plan.config).num_perm
    if docs.size == 0:
        return np.zeros((0, num_perm), dtype=near_dedup.SIGNATURE_DTYPE)
    path = unit_sigs_path(plan.staging_dir, name)
    if not io_utils.is_local(path):
        return _unit_sigs(plan, name)[docs]
    table = np.memmap(path, dtype=near_dedup.SIGNATURE_DTYPE, mode="r").reshape(-1, num_perm)
    try:
        return np.array(table[docs])
    finally:
        del table


def committed_range_rows(entry: dict, num_perm: int):
    """(band key, committed Node) of one committed band index file (the runner shuffle's elements): checked
    first, streamed whole against its manifest row (size, sha256) and for keys outside its range (a RunError
    on the call), then read a window at a time (_RangeWindows), so no process holds the whole file."""
    ranges = _RangeWindows(None, entry["range"], (), (entry,), num_perm)
    at = ranges._committed_bounds()
    return (row for w in range(len(ranges)) for row in ranges._committed_rows(w, at))


def range_edges(task, plan, committed: tuple = ()):
    """Files shuffle: the buckets of one key range, read from every unit's band file (and, incrementally, the
    committed generations' band index files of that range); the same edges as the runner's GroupByKey gives
    (bucket_edges sorts the members, so arrival order does not matter). Only buckets with more than one row
    become Nodes (numpy finds them): on distinct text nearly none. Window by window (_RangeWindows): a bucket is
    one key, so it lies in one window, and the edges come in the same (key) order as from the whole range."""
    r, unit_names = task
    num_perm = params_of(plan.config).num_perm
    threshold = plan.config.near_dedup_threshold
    for parts, committed_rows in _RangeWindows(plan, r, unit_names, committed, num_perm).windows():
        yield from _window_edges(plan, parts, committed_rows, threshold)


# A bucket of more band rows than this (a boilerplate text with many distinct near-copies) is not built whole:
# its members are found in numpy and made Nodes HOT_CHUNK at a time, per unit (_hot_bucket_edges): the same
# edges, in another order.
HOT_BUCKET_ROWS = 1 << 16
HOT_CHUNK = 1 << 13


def _window_edges(plan, parts: list, committed_rows: list, threshold: float):
    all_keys = np.concatenate([a["key"] for _n, a in parts]
                              + [np.array([k for k, _n in committed_rows], dtype=np.uint64)])
    keys, counts = np.unique(all_keys, return_counts=True)
    shared = keys[(counts > 1) & (counts <= HOT_BUCKET_ROWS)]
    hot = keys[counts > HOT_BUCKET_ROWS].tolist()
    if not shared.size and not hot:
        return
    hits = [a[np.isin(a["key"], shared)] for _name, a in parts]
    units = np.concatenate([np.full(h.size, u, dtype=np.int32) for u, h in enumerate(hits)])
    hit = np.concatenate(hits)
    nodes = _member_nodes(plan, parts, hit["doc_id"], hit["split"].astype(np.int16), units, hit["doc"],
                          np.arange(hit.size))
    buckets: dict = {}
    for key, node in zip(hit["key"].tolist(), nodes):
        buckets.setdefault(key, []).append(node)
    shared_set, hot_set = set(shared.tolist()), set(hot)
    hot_committed: dict = {}
    for k, node in committed_rows:
        if k in shared_set:
            buckets.setdefault(k, []).append(node)
        elif k in hot_set:
            hot_committed.setdefault(k, []).append(node)
    for key in sorted(set(buckets) | hot_set):
        if key in hot_set:
            yield from _hot_bucket_edges(plan, key, parts, hot_committed.get(key, []), threshold)
        elif len(buckets[key]) > 1:
            yield from near_dedup.bucket_edges(buckets[key], threshold)


def _hot_bucket_edges(plan, key: int, parts: list, committed_nodes: list, threshold: float):
    """near_dedup.bucket_edges of one large bucket, without a Node per member at once: the same edges, in
    another order (nothing downstream depends on it: the adjacency is grouped and sorted). The members are
    chosen and ranked in numpy as merge_copies does (per id the copy in the highest split, then the smallest
    location: the first unit in name order, as a Node's location starts with its unit's name; then by rank);
    the star's centre is the best-ranked one. Then unit by unit, HOT_CHUNK members at a time (each unit's
    documents read once): each member's edge to the first committed member near it and to the centre. The
    committed members (incremental) are Nodes already, as read for the window."""
    ids, splits, units, docs = [], [], [], []
    for u, (_name, a) in enumerate(parts):
        m = a[a["key"] == np.uint64(key)]
        ids.append(m["doc_id"])
        splits.append(m["split"].astype(np.int16))
        docs.append(m["doc"])
        units.append(np.full(m.size, u, dtype=np.int32))
    ids, splits, units, docs = (np.concatenate(x) for x in (ids, splits, units, docs))
    committed = near_dedup.merge_copies(committed_nodes)
    if np.isin(ids, np.array([c.doc_id for c in committed], dtype=np.uint64)).any():  # not expected (exact
        nodes = _member_nodes(plan, parts, ids, splits, units, docs, np.arange(ids.size))  # copies of committed
        yield from near_dedup.bucket_edges(nodes + committed_nodes, threshold)  # documents take no part): whole
        return
    order = np.lexsort((units, -splits, ids))
    first = np.ones(order.size, dtype=bool)
    first[1:] = ids[order][1:] != ids[order][:-1]
    pick = order[first]
    if not pick.size or pick.size + len(committed) < 2:
        return
    best = pick[np.lexsort((ids[pick], -splits[pick]))[0]]  # rank: the highest split, then the smallest id
    centre = _member_nodes(plan, parts, ids, splits, units, docs, np.array([best]))[0]
    csig = centre.signature()
    committed_sigs = [c.signature() for c in committed]
    by_unit = pick[np.argsort(units[pick], kind="stable")]
    cuts = np.flatnonzero(np.diff(units[by_unit])) + 1
    for rows in np.split(by_unit, cuts):
        for start in range(0, rows.size, HOT_CHUNK):
            for m in _member_nodes(plan, parts, ids, splits, units, docs, rows[start:start + HOT_CHUNK]):
                msig = m.signature()
                for c, sig in zip(committed, committed_sigs):
                    j = near_dedup.estimated_jaccard(sig, msig)
                    if j >= threshold:
                        yield c, m, j
                        break
                if m.doc_id != centre.doc_id:
                    j = near_dedup.estimated_jaccard(csig, msig)
                    if j >= threshold:
                        yield centre, m, j


def _member_nodes(plan, parts, ids, splits, units, docs, picked) -> list:
    """Nodes of the bucket rows `picked`, in that order (each unit's signatures and documents read once)."""
    out: list = [None] * picked.size
    for u in np.unique(units[picked]).tolist():
        at = np.flatnonzero(units[picked] == u)
        rows = picked[at]
        name = parts[u][0]
        sigs = _unit_sig_rows(plan, name, docs[rows].astype(np.int64))
        meta = pickle.loads(io_utils.read_bytes(unit_docs_path(plan.staging_dir, name)))
        for k, (i, r) in enumerate(zip(at.tolist(), rows.tolist())):
            doc_id, split = int(ids[r]), int(splits[r])
            source, loc = meta[int(docs[r])]
            out[i] = near_dedup.Node(near_dedup.rank(split, doc_id), doc_id, split, sigs[k].tobytes(), source, loc)
    return out


def contaminated_splits(config) -> list:
    return list(range(len(SPLITS))) if config.decontaminate_held_out else [0]


def _read_shingles(staging_dir: str, loc: tuple) -> np.ndarray:
    _name, _line, start, count = loc
    with io_utils.open_read(shingle_path(staging_dir, loc[0])) as f:
        f.seek(start * 8)
        return np.frombuffer(f.read(count * 8), dtype="<u8")


def _verify(edge, plan):
    a, b, est = edge
    if a.committed or b.committed:  # committed shingles are not kept: the estimate decided the edge
        yield a, b, est
        return
    j = near_dedup.exact_jaccard(_read_shingles(plan.staging_dir, a.loc), _read_shingles(plan.staging_dir, b.loc))
    if j >= plan.config.near_dedup_threshold:
        yield a, b, j


def _adjacency(edge):
    a, b, _j = edge
    yield a.doc_id, (a, b.doc_id)
    yield b.doc_id, (b, a.doc_id)


def _initial_state(kv):
    """(doc_id, (node, neighbour ids, label, changed)): the label starts as the node itself."""
    doc_id, pairs = kv
    pairs = list(pairs)
    node = min(p[0] for p in pairs)  # copies of one Node: identical, min only makes the choice explicit
    return doc_id, (node, tuple(sorted({p[1] for p in pairs})), node, True)


def _messages(kv):
    doc_id, (node, nbrs, label, _changed) = kv
    yield doc_id, ("state", (node, nbrs, label))
    for m in nbrs:
        yield m, ("label", label)


def _relabel(kv):
    doc_id, msgs = kv
    state, labels = None, []
    for kind, value in msgs:
        if kind == "state":
            state = value
        else:
            labels.append(value)
    node, nbrs, label = state
    new = near_dedup.best_label([label] + labels)
    return doc_id, (node, nbrs, new, new != label)


def _final_rows(kv, rounds: int):
    doc_id, (node, _nbrs, keeper, changed) = kv
    if changed:
        raise RunError(f"near-dedup clusters did not converge within --near-dedup-rounds {rounds} (a cluster "
                       "holds documents farther apart than that); raise --near-dedup-rounds")
    yield ("cluster", keeper.doc_id)
    removal = None if node.committed else near_dedup.removal_of(node, keeper)  # committed files are immutable
    if removal is not None:
        removed, keeper_id, j = removal
        row = {"id": removed, "reason": removals.NEAR_DUPLICATE, "keeper": keeper_id, "jaccard": j,
               "source": node.source, "keeper_source": keeper.source, "loc": list(node.loc[:2]),
               "keeper_loc": list(keeper.loc[:2])}
        if keeper.committed:
            row.update(reason=removals.NEAR_DUPLICATE_OF_COMMITTED, keeper_generation=keeper.loc[1], keeper_loc=[])
        yield ("removal", removed, row)


def _write_partition(kv, plan):
    """One id partition's removals: an id index per reason (staging, for the packers) and its sidecar rows
    (the generation's `near-dedup/`), sorted by id. One id with two rows (a contaminated train copy and a
    near-duplicate held-out copy) keeps the reason that comes first in removals.REASONS."""
    partition, rows = kv
    order = {r: i for i, r in enumerate(removals.REASONS)}
    best: dict = {}
    for row in rows:
        key = (order[row["reason"]], json.dumps(row, sort_keys=True))
        if row["id"] not in best or key < best[row["id"]][0]:
            best[row["id"]] = (key, row)
    chosen = [best[i][1] for i in sorted(best)]
    indexes = []
    for reason in removals.REASONS:
        ids = np.array([r["id"] for r in chosen if r["reason"] == reason], dtype=doc_ids.ID_DTYPE)
        if ids.size:
            path = removals.index_path(plan.staging_dir, reason, partition)
            doc_ids.write_index(path, iter([ids]), int(ids.size))
            indexes.append((reason, path))
    sidecar = io_utils.join(plan.data_dir, SIDECAR_DIR, f"removed-p{partition:03d}.jsonl")
    io_utils.write_jsonl(sidecar, [{k: v for k, v in r.items() if k not in ("loc", "keeper_loc")}
                                   for r in chosen])
    examples = [r for r in chosen if r["reason"] == removals.NEAR_DUPLICATE][:EXAMPLE_PAIRS]
    contaminated = [r for r in chosen if r["reason"] == removals.CONTAMINATED][:EXAMPLE_PAIRS]
    return {"partition": partition, "indexes": indexes, "sidecar": sidecar, "examples": examples,
            "contaminated_examples": contaminated,
            "removed": dict(collections.Counter(r["reason"] for r in chosen))}


def _text_at(plan, loc) -> str:
    if len(loc) < 2:
        return ""
    unit_name, line = loc[0], loc[1]
    cfg = plan.config
    with io_utils.open_read(layout.Layout(plan.staging_dir, plan.data_dir).path(layout.chunk_file(unit_name))) as f:
        for ln, data in iter_chunk(f):
            if ln == line:
                doc = parse_record(data, cfg.text_field, tuple(cfg.source_fields))
                return doc.text if isinstance(doc, Document) else ""
    return ""


def _finish(grouped, plan):
    """The stage's last step (one element): the packers' marker and the generation's summary file."""
    parts = sorted((v for k, v in grouped if k == "partition"), key=lambda p: p["partition"])
    sizes = collections.Counter(v for k, v in grouped if k == "size")
    indexes = [tuple(i) for p in parts for i in p["indexes"]]
    io_utils.fsync_files([p for _r, p in indexes] + [p["sidecar"] for p in parts])
    examples = sorted((e for p in parts for e in p["examples"]), key=lambda e: e["id"])[:EXAMPLE_PAIRS]
    pairs = [{"removed": e["id"], "keeper": e["keeper"], "jaccard": e["jaccard"], "source": e["source"],
              "keeper_source": e["keeper_source"], "removed_text": _text_at(plan, e["loc"])[:EXCERPT_CHARS],
              "keeper_text": _text_at(plan, e["keeper_loc"])[:EXCERPT_CHARS]} for e in examples]
    contaminated = sorted((e for p in parts for e in p["contaminated_examples"]),
                          key=lambda e: e["id"])[:EXAMPLE_PAIRS]
    band_files = sorted((v for k, v in grouped if k == "band_index"), key=lambda b: b["range"])
    io_utils.fsync_files([b["path"] for b in band_files])
    sidecars = []
    for p in parts:
        size, sha = _digest(p["sidecar"])
        sidecars.append({"path": _dataset_relative(p["sidecar"], plan.config.output), "bytes": size, "sha256": sha})
    cfg = plan.config
    summary = {
        "near_dedup": cfg.near_dedup,
        "decontaminate": [_name(p) for p in eval_files(cfg)] if cfg.decontaminate else [],
        "removed": dict(sorted(sum((collections.Counter(p["removed"]) for p in parts), collections.Counter())
                               .items())),
        "cluster_sizes": near_dedup.cluster_size_bins(
            [size for size, n in sorted(sizes.items()) for _ in range(n)]),
        "example_pairs": pairs,
        "contaminated_examples": [{k: e[k] for k in ("id", "source", "eval_file", "ngram")} for e in contaminated],
        "sidecars": sidecars,
    }
    if band_files:
        summary["band_index"] = [{"range": b["range"], "path": _dataset_relative(b["path"], plan.config.output),
                                  "rows": b["rows"], "bytes": b["bytes"], "sha256": b["sha256"]}
                                 for b in band_files]
    if cfg.near_dedup:
        summary["minhash"] = {"bands": cfg.near_dedup_bands, "rows": cfg.near_dedup_rows,
                              "threshold": cfg.near_dedup_threshold, "verify": cfg.near_dedup_verify,
                              "shingle_words": near_dedup.SHINGLE_WORDS, "sketch": params_of(cfg).sketch,
                              "s_curve": near_dedup.s_curve_text(cfg.near_dedup_bands, cfg.near_dedup_rows)}
        if params_of(cfg).shingles != near_dedup.DEFAULT_SHINGLES:  # absent at the default: sections as before
            summary["minhash"].update(shingles=params_of(cfg).shingles, shingle_tokens=near_dedup.SHINGLE_TOKENS)
    for e in summary["contaminated_examples"]:
        e["eval_file"] = _name(e["eval_file"])
    summary_path = io_utils.join(plan.data_dir, SUMMARY_NAME)
    io_utils.write_bytes(summary_path, json.dumps(summary, sort_keys=True, indent=1).encode("utf-8"))
    staged = [p for _r, p in indexes] + [removals.write_marker(plan.staging_dir, indexes, contaminated_splits(cfg))]
    # The global stage's completion marker, last: a rerun of this generation skips the stage (pipeline/shard/markers.py mark_near_dedup)
    markers.mark_near_dedup(plan, staged, [p["sidecar"] for p in parts] + [b["path"] for b in band_files]
                           + [summary_path])
    return "done"


def _name(path: str) -> str:
    """An evaluation file as the manifest records it: its base name (absolute paths say where it ran)."""
    return path.rstrip("/").rsplit("/", 1)[-1]


def _digest(path: str) -> tuple:
    data = io_utils.read_bytes(path)
    return len(data), hashlib.sha256(data).hexdigest()


def _gather(pcoll, label: str):
    return (pcoll
            | f"{label}OneKey" >> beam.Map(lambda x: (0, x))
            | f"{label}Group" >> beam.GroupByKey()
            | f"{label}List" >> beam.Map(lambda kv: list(kv[1])))


class NearDedup(beam.PTransform):
    """units → the same units, released once the removal indexes are staged (see the module docstring)."""

    def __init__(self, plan, shuffle: str = "runner"):
        super().__init__()
        self.plan = plan
        self.shuffle = shuffle  # 'runner' (GroupByKey on band keys) or 'files' (staged band files, key ranges)
        self.eval_paths = tuple(eval_files(plan.config)) if plan.config.decontaminate else ()
        # --incremental: new documents meet the committed generations' kept documents in the band buckets
        self.committed = (tuple(committed_band_indexes(plan.previous, plan.config.output,
                                                       params_of(plan.config).shingles))
                          if plan.incremental and plan.config.near_dedup else ())

    def expand(self, units):
        plan, cfg = self.plan, self.plan.config
        signed = units | "NDSign" >> beam.ParDo(SignUnit(plan, self.eval_paths, self.shuffle))
        rows = [signed | "NDContaminated" >> beam.Filter(lambda e: e[0] == "removal")]
        sizes = []
        if cfg.near_dedup and self.shuffle == "files":
            edges = (signed
                     | "NDBandFiles" >> beam.FlatMap(lambda e: [e[1]] if e[0] == "bands" else [])
                     | "NDCollectBandFiles" >> _GatherAll()
                     | "NDRanges" >> beam.FlatMap(lambda names: [(r, tuple(sorted(names)))
                                                                 for r in range(BAND_RANGES)])
                     | "NDKeyRanges" >> beam.Map(lambda t: (t[0], t))  # a GroupByKey spreads them on every
                     | "NDSpreadRanges" >> beam.GroupByKey()  # runner (Reshuffle is a no-op on DaskRunner)
                     | "NDRangeTasks" >> beam.FlatMap(lambda kv: kv[1])
                     | "NDEdges" >> beam.FlatMap(range_edges, plan, self.committed))
        elif cfg.near_dedup:
            bands = [signed | "NDBands" >> beam.FlatMap(lambda e: [(e[1], e[2])] if e[0] == "band" else [])
                     .with_output_types(typing.Any)]
            if self.committed:  # one element per committed file, read where it lands
                num_perm = params_of(cfg).num_perm
                bands.append(units.pipeline
                             | "NDCommittedFiles" >> beam.Create([dict(e) for e in self.committed])
                             | "NDCommittedRows" >> beam.FlatMap(committed_range_rows, num_perm)
                             .with_output_types(typing.Any))
            edges = (tuple(bands) | "NDAllBands" >> beam.Flatten()
                     | "NDGroupBands" >> beam.GroupByKey()
                     | "NDEdges" >> beam.FlatMap(lambda kv, t: near_dedup.bucket_edges(kv[1], t),
                                                 cfg.near_dedup_threshold))
        if cfg.near_dedup:
            if cfg.near_dedup_verify:
                edges = edges | "NDVerify" >> beam.FlatMap(_verify, plan)
            state = (edges
                     | "NDAdjacency" >> beam.FlatMap(_adjacency)
                     | "NDGroupAdjacency" >> beam.GroupByKey()
                     | "NDInitial" >> beam.Map(_initial_state))
            for r in range(cfg.near_dedup_rounds):
                state = (state
                         | f"NDMessages{r}" >> beam.FlatMap(_messages)
                         | f"NDGroupMessages{r}" >> beam.GroupByKey()
                         | f"NDRelabel{r}" >> beam.Map(_relabel))
            final = state | "NDFinal" >> beam.FlatMap(_final_rows, cfg.near_dedup_rounds)
            rows.append(final | "NDNearRows" >> beam.Filter(lambda e: e[0] == "removal"))
            sizes.append(final
                         | "NDKeepers" >> beam.FlatMap(lambda e: [e[1]] if e[0] == "cluster" else [])
                         | "NDClusterSize" >> beam.combiners.Count.PerElement()
                         | "NDSizes" >> beam.Map(lambda kv: ("size", kv[1])).with_output_types(typing.Any))
        partitions = (tuple(rows) | "NDRows" >> beam.Flatten()
                      | "NDByPartition" >> beam.Map(lambda e: (removals.partition_of(e[1]), e[2]))
                      | "NDGroupPartitions" >> beam.GroupByKey()
                      | "NDWritePartition" >> beam.Map(_write_partition, plan)
                      | "NDTagPartition" >> beam.Map(lambda p: ("partition", p)).with_output_types(typing.Any))
        if cfg.near_dedup:  # the generation's band index, of the documents it keeps: after the removals
            names = signed | "NDIndexNames" >> beam.FlatMap(
                lambda e: [("bands", e[1])] if e[0] == "bands" else []).with_output_types(typing.Any)
            sizes.append((names, partitions) | "NDIndexInputs" >> beam.Flatten()
                         | "NDIndexGather" >> _GatherAll()
                         | "NDIndexTasks" >> beam.FlatMap(band_index_tasks)
                         | "NDIndexKeys" >> beam.Map(lambda t: (t[0], t))
                         | "NDSpreadIndex" >> beam.GroupByKey()
                         | "NDIndexTask" >> beam.FlatMap(lambda kv: kv[1])
                         | "NDWriteIndex" >> beam.Map(write_band_index_range, plan)
                         | "NDTagIndex" >> beam.Map(lambda i: ("band_index", i)).with_output_types(typing.Any))
        # One gather for the stage's end and the barrier: the units pass on from the step that staged the
        # removal indexes, so no packer can start before they exist (the seed makes the step run when
        # nothing at all is removed and no unit exists).
        # Every input of a Flatten is typed Any: inferred tuple types give the inputs different coders, and a
        # runner that fuses a Flatten's consumer decodes every input with one of them (FnApiRunner with worker
        # threads failed "Invalid PaneInfoEncoding" on the seed's inferred Tuple[str, None] coder).
        seed = units.pipeline | "NDSeed" >> beam.Create([("seed", None)]).with_output_types(typing.Any)
        tagged_units = units | "NDTagUnits" >> beam.Map(lambda u: ("unit", u)).with_output_types(typing.Any)
        return ((tagged_units, partitions, seed, *sizes)
                | "NDGatherParts" >> beam.Flatten()
                | "NDCollect" >> _GatherAll()
                | "NDFinishAndRelease" >> beam.FlatMap(_finish_and_release, plan))


def committed_shingles(previous) -> str:
    """The shingle kind the committed dataset's band index was built with: its config's `near_dedup_shingles`,
    absent at the default (pipeline/config.py to_manifest_dict drops it, as in datasets built before it)."""
    return str(dict(previous.config).get("near_dedup_shingles", near_dedup.DEFAULT_SHINGLES))


def committed_band_indexes(previous, output_dir: str, shingles: str = near_dedup.DEFAULT_SHINGLES) -> list:
    """Every committed generation's band index files, paths validated: [{generation, rel, path, range, bytes,
    sha256}]. A generation without one (built before band indexes were written) cannot be checked, and
    skipping it would keep near-copies of its documents: a configuration error naming the fix. Signatures of
    word and token shingles never agree, so new documents signed with another kind than the committed band
    index would match none of its documents: refused, naming the option."""
    from model_contract import MANIFEST_NAME  # noqa: PLC0415
    from model_contract.manifest import is_generation_name, resolve_dataset_path  # noqa: PLC0415

    if previous is None:
        return []
    if committed_shingles(previous) != shingles:
        raise ConfigError(f"--incremental --near-dedup: --near-dedup-shingles {shingles} differs from the committed "
                          f"dataset's ({committed_shingles(previous)}) in {output_dir}: its band index could not match "
                          f"new documents; run with --near-dedup-shingles {committed_shingles(previous)} or rebuild "
                          "without --incremental")
    rows = list(previous.band_indexes or [])  # BandIndexRow (model_contract/manifest.py), checked on load
    manifest_file = io_utils.join(output_dir, MANIFEST_NAME)
    out = []
    for i, row in enumerate(rows):
        what = f"{BAND_INDEXES}[{i}]"
        rel, generation = str(row.path), str(row.generation)
        if (not is_generation_name(generation) or rel.split("/", 1)[0] != generation
                or not isinstance(row.range, int) or not 0 <= row.range < BAND_RANGES
                or not isinstance(row.bytes, int) or not isinstance(row.sha256, str)):
            raise ConfigError(f"--incremental --near-dedup: the committed manifest's {what} is malformed "
                              "(generation, path inside it, range, bytes, sha256); rebuild without --incremental")
        try:
            path = resolve_dataset_path(manifest_file, rel, f"{what}.path")
        except ValueError as e:  # ContractError: a path that leaves the dataset directory
            raise ConfigError(f"--incremental --near-dedup: {e}; rebuild without --incremental") from None
        out.append({"generation": generation, "rel": rel, "range": row.range, "bytes": row.bytes,
                    "sha256": row.sha256, "path": path})
    held = {e["generation"] for e in out}
    missing = sorted({g["name"] for g in integrity.generations_of(previous)} - held)
    if missing:
        raise ConfigError(f"--incremental --near-dedup: generation(s) {', '.join(missing)} of {output_dir} have no "
                          "band index (built without --near-dedup or by an older pileprep), so new documents "
                          "cannot be checked against them; rebuild the dataset without --incremental once")
    return out


def band_index_tasks(gathered):
    """One task per band-key range once every removal partition is written: (range, unit names, indexes)."""
    names = tuple(sorted(v for k, v in gathered if k == "bands"))
    indexes = tuple(sorted(tuple(i) for k, p in gathered if k == "partition" for i in p["indexes"]))
    return [(r, names, indexes) for r in range(BAND_RANGES)]


def write_band_index_range(task, plan) -> dict:
    """One range of the generation's band index: the staged band rows of that range, less every removed id.
    Window by window (_RangeWindows), appended in key order: encode_arrays sorts by (key, id) and keeps one row
    per (key, id), and one key lies in one window, so the bytes are those of encoding the whole range at once."""
    r, names, indexes = task
    num_perm = params_of(plan.config).num_perm
    removed_ids = [doc_ids.IdIndex(path) for _reason, path in indexes]
    path = io_utils.join(plan.data_dir, band_index.FILE_PATTERN.format(r))
    with io_utils.open_write(path) as raw, io_utils.HashingWriter(raw) as out:
        for parts, _committed in _RangeWindows(plan, r, names, (), num_perm).windows():
            out.write(_window_index_bytes(plan, parts, removed_ids, num_perm))
    return {"range": r, "path": path, "rows": out.bytes // band_index.row_dtype(num_perm).itemsize,
            "bytes": out.bytes, "sha256": out.sha256}


def _window_index_bytes(plan, parts: list, removed_ids: list, num_perm: int) -> bytes:
    parts = [(name, a) for name, a in parts if a.size]
    if not parts:
        return b""
    rows = np.concatenate([a for _n, a in parts])
    removed = np.zeros(rows.size, dtype=bool)
    for index in removed_ids:
        removed |= index.contains(rows["doc_id"].astype(doc_ids.ID_DTYPE))
    kept = ~removed
    # the kept rows' signatures only, gathered per unit (a document's row in its unit's table)
    sigs, start = [], 0
    for name, a in parts:
        k = kept[start:start + a.size]
        sigs.append(_unit_sig_rows(plan, name, a["doc"][k].astype(np.int64)))
        start += a.size
    return band_index.encode_arrays(rows["key"][kept], rows["doc_id"][kept], rows["split"][kept],
                                    np.concatenate(sigs), num_perm)


def _finish_and_release(grouped, plan):
    _finish(grouped, plan)
    return sorted((v for k, v in grouped if k == "unit"), key=lambda u: u.name)


class _GatherAll(beam.PTransform):
    def expand(self, pcoll):
        return _gather(pcoll, "")


def _dataset_relative(path: str, base: str) -> str:
    from model_contract.manifest import dataset_relative_path  # noqa: PLC0415

    return dataset_relative_path(path, base)
