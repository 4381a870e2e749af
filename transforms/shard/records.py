"""Every record the shard job's stages hand each other, in stage order, and their one checked JSON form.

  LedgerEntry, InputFile   the plan's input files (path, size; as listed, and the sha256 once cut)
  ChunkRef, CutResult      cut: one input file -> its line-aligned chunks (transforms/shard/cut.py)
  CutOutput                what the cut stage hands on for a file: its CutResult and the InputFile read
  UnitResult               tokenize: one chunk -> one sorted unit (transforms/shard/tokenize_unit.py)
  TokenizedFile            cut and tokenize in one worker: a file's CutOutput and its units
  DedupInputs              exact dedup: the id files a packer checks (transforms/shard/exact_dedup.py)
  ShardTask, ShardResult   pack: one (split, shard) -> one TFRecord shard (transforms/shard/pack.py)
  CommitParts              every stage's results gathered for the commit
  FileStats                the record counts each of them carries

A record that is written to a completion marker (pipeline/shard/markers.py) has `to_json` and a checked
`from_json`: the marker was written by another process and is read back from a directory, so every field is
type-checked (BadRecord names the first that is not) and every path is made here from the record's name through
transforms/shard/layout.py, never read from the JSON.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Optional

from transforms.shard import layout
from transforms.shard.documents import SPLITS, split_wins
from transforms.shard.layout import Layout

_UNIT_NAME = re.compile(r"f[0-9]{6}-c[0-9]{5}")


class BadRecord(ValueError):
    """A record read back that does not check (or a marker that does not match this run); the message says why."""


def _need(d, key: str, kind: type):
    value = d.get(key) if isinstance(d, dict) else None
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        raise BadRecord(f"field {key!r} missing or not {kind.__name__}")
    return value


def _counts(d) -> dict[str, int]:
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in d.items()):
        raise BadRecord("a count table is not {name: int}")
    return dict(d)


def _json_tree(value):
    """source_stats / spot_checked / packing: nested dicts and lists of numbers (transforms/shard/corpus_stats.py)."""
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise BadRecord("a stats table has a non-string key")
        return {k: _json_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_tree(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    raise BadRecord("a stats table holds something other than numbers")


@dataclass
class FileStats:
    """Record counts of (part of) one input file: every record read is written, filtered or dead-lettered,
    each with a reason. Stages count what they settle; pipeline/shard/manifest_builder.py sums them per file
    and checks read == written + filtered + dead-lettered before anything is committed."""
    read: int = 0
    written: int = 0
    filtered: dict[str, int] = field(default_factory=dict)  # reason -> count
    dead_lettered: dict[str, int] = field(default_factory=dict)  # reason -> count

    def filter(self, reason: str, n: int = 1) -> None:
        self.filtered[reason] = self.filtered.get(reason, 0) + n

    def dead_letter(self, reason: str, n: int = 1) -> None:
        self.dead_lettered[reason] = self.dead_lettered.get(reason, 0) + n

    def settled(self) -> int:
        return self.written + sum(self.filtered.values()) + sum(self.dead_lettered.values())

    def merge(self, other: "FileStats") -> "FileStats":
        self.read += other.read
        self.written += other.written
        for reason, n in other.filtered.items():
            self.filter(reason, n)
        for reason, n in other.dead_lettered.items():
            self.dead_letter(reason, n)
        return self

    def to_dict(self) -> dict:
        """The manifest's form (`records` and each `inputs` row; model_contract/manifest_rows.py RecordCounts), and
        the markers'."""
        return {"read": self.read, "written": self.written, "filtered": dict(sorted(self.filtered.items())),
                "dead_lettered": dict(sorted(self.dead_lettered.items()))}

    @classmethod
    def from_dict(cls, d: dict) -> "FileStats":
        """Checked: BadRecord unless every count is an int."""
        return cls(_need(d, "read", int), _need(d, "written", int), _counts(d.get("filtered", {})),
                   _counts(d.get("dead_lettered", {})))


def dead_letter_row(path: str, line: int, reason: str, excerpt: str, detail: str = "") -> dict:
    row = {"file": path, "line": line, "reason": reason, "excerpt": excerpt}
    if detail:
        row["detail"] = detail
    return row


# ------------------------------------------------------------------------------------------ input files
@dataclass(frozen=True)
class LedgerEntry:
    """An input file the plan ingests: its path and size as listed (the generation's identity hashes these); its
    index in the plan's `ledger` is the `file_idx` every stage carries."""
    path: str
    size: int


@dataclass(frozen=True)
class InputFile:
    """One input file as listed (path, bytes, mtime / ETag) and, once the cut stage has read it, the sha256 of its
    bytes. `to_dict` is the listing row pipeline/ops/incremental.py diffs against the ledger (a
    `model_contract.manifest.LedgerRow` without the generation)."""
    path: str
    bytes: int
    mtime: Optional[float] = None  # local files: the change check after size (pipeline/ops/incremental.py)
    etag: Optional[str] = None  # object stores
    sha256: Optional[str] = None  # of the bytes the cut stage read

    def to_dict(self) -> dict:
        d = {"path": self.path, "bytes": self.bytes}
        d.update({k: v for k, v in (("mtime", self.mtime), ("etag", self.etag), ("sha256", self.sha256))
                  if v is not None})
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "InputFile":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


# ------------------------------------------------------------------------------------------------- cut
@dataclass(frozen=True)
class ChunkRef:
    file_idx: int
    input_path: str
    chunk_idx: int
    chunk_path: str  # "" when the chunk went straight to the tokenizer (never spilled)
    records: int
    raw_bytes: int

    @property
    def unit_name(self) -> str:
        return layout.unit_name_of(self.file_idx, self.chunk_idx)


@dataclass
class CutResult:
    file_idx: int
    input_path: str
    chunks: list[ChunkRef]
    stats: FileStats  # records this stage settled itself (damage)
    dead_letter_path: Optional[str]
    spilled: bool = True  # its chunks are files in staging (cut_input_file); else they went straight on


@dataclass(frozen=True)
class CutOutput:
    """What the cut stage hands on for one input file: its chunks and what was read of it (for the ledger).

    One element type on one output: some runners (Beam's DaskRunner) mix a multi-output ParDo's outputs into
    one collection, so the digest travels inside the main output instead of on a tagged one.
    """
    result: CutResult
    digest: InputFile  # path, bytes read, sha256 of them

    def to_json(self) -> dict:
        r = self.result
        return {"file_idx": r.file_idx, "input_path": r.input_path, "stats": r.stats.to_dict(),
                "dead_letter": r.dead_letter_path is not None, "digest": self.digest.to_dict(),
                "chunks": [{"records": c.records, "raw_bytes": c.raw_bytes} for c in r.chunks],
                "spilled": r.spilled}

    @classmethod
    def from_json(cls, rec: dict, where: Layout) -> "CutOutput":
        idx, path = _need(rec, "file_idx", int), _need(rec, "input_path", str)
        spilled = rec.get("spilled", True)
        if not isinstance(spilled, bool):
            raise BadRecord("spilled is not a bool")
        chunks = []
        for i, c in enumerate(_need(rec, "chunks", list)):
            chunk_path = where.path(layout.chunk_file(layout.unit_name_of(idx, i))) if spilled else ""
            chunks.append(ChunkRef(idx, path, i, chunk_path, _need(c, "records", int), _need(c, "raw_bytes", int)))
        digest = _need(rec, "digest", dict)
        try:
            input_file = InputFile.from_dict(digest)
        except TypeError as e:
            raise BadRecord(f"digest: {e}") from None
        if not (isinstance(input_file.path, str) and isinstance(input_file.bytes, int)
                and isinstance(input_file.sha256, str)):
            raise BadRecord("digest has the wrong types")
        dead = _need(rec, "dead_letter", bool)
        result = CutResult(idx, path, chunks, FileStats.from_dict(rec.get("stats")),
                           where.path(layout.cut_dead_letters(idx)) if dead else None, spilled)
        return cls(result, input_file)


# -------------------------------------------------------------------------------------------- tokenize
@dataclass
class UnitResult:
    name: str
    file_idx: int
    input_path: str
    index_path: str
    tokens_path: str
    n_docs: int
    token_dtype: str
    sources: list[str]  # source names; index rows refer to them by position
    split_tokens: list[int]  # tokens incl. EOS per split (train, val, test), before dedup
    stats: FileStats  # this chunk's records (written is settled later by pack)
    dead_letter_path: Optional[str]
    # source -> {counter: n, or a length histogram} (transforms/shard/corpus_stats.py), before dedup
    source_stats: dict[str, dict[str, int | list[int]]] = field(default_factory=dict)
    # First index row of a held-out split (val, then test: the split is the sort key's top bits), so the global
    # dedup pass reads them with one ranged read, no search. tokenize_chunk always sets it; None (a unit built
    # by hand, as some tests do) makes the pass search the index instead.
    held_out_start: Optional[int] = None
    # A fast tokenizer backend's spot check over this chunk (transforms/tokenize/tokenizer_backends.py): documents
    # and bytes seen and re-encoded with the reference; empty with the reference itself.
    spot_checked: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"name": self.name, "file_idx": self.file_idx, "input_path": self.input_path, "n_docs": self.n_docs,
                "token_dtype": self.token_dtype, "sources": list(self.sources),
                "split_tokens": list(self.split_tokens), "stats": self.stats.to_dict(),
                "dead_letter": self.dead_letter_path is not None, "source_stats": self.source_stats,
                "held_out_start": self.held_out_start, "spot_checked": self.spot_checked}

    @classmethod
    def from_json(cls, rec: dict, where: Layout) -> "UnitResult":
        """The UnitResult a marker describes, with paths made from the unit's name (never read from it)."""
        name = _need(rec, "name", str)
        if not _UNIT_NAME.fullmatch(name):
            raise BadRecord(f"unit name {name!r} is not f<file>-c<chunk>")
        sources = _need(rec, "sources", list)
        split_tokens = _need(rec, "split_tokens", list)
        if not all(isinstance(s, str) for s in sources) or not all(isinstance(t, int) for t in split_tokens):
            raise BadRecord("sources / split_tokens have the wrong types")
        held_out = rec.get("held_out_start")
        if held_out is not None and not isinstance(held_out, int):
            raise BadRecord("held_out_start is not an int")
        dead = _need(rec, "dead_letter", bool)
        return cls(name, _need(rec, "file_idx", int), _need(rec, "input_path", str),
                   where.path(layout.unit_index(name)), where.path(layout.unit_tokens(name)),
                   _need(rec, "n_docs", int), _need(rec, "token_dtype", str), list(sources), list(split_tokens),
                   FileStats.from_dict(rec.get("stats")), where.path(layout.unit_dead_letters(name)) if dead else None,
                   _json_tree(rec.get("source_stats", {})), held_out, _json_tree(rec.get("spot_checked", {})))


@dataclass(frozen=True)
class TokenizedFile:
    """What cutting and tokenizing one input file in one worker hands on (pipeline/shard/stage_dofn.py
    CutAndTokenizeFile): its cut and the units of its chunks, in chunk order."""
    cut: CutOutput
    units: tuple[UnitResult, ...]


# ------------------------------------------------------------------------------------------------ dedup
@dataclass(frozen=True)
class DedupInputs:
    """What a packer needs to drop exact duplicates that live outside its own shard (transforms/shard/doc_ids.py).

    Copies of one document in one split share a sort key, so they meet in one shard and the packer keeps the
    first. Copies in *different* splits (a --val-input document also in a train file) never meet: the
    global pass `index_held_out_ids` lists each held-out split's ids once, and a packer drops a document that a
    winning split (`split_wins`) also holds. Copies in committed generations (`--incremental`) are found in
    their id indexes."""
    held_out: tuple[tuple[int, str], ...] = ()  # (split, path of its sorted id file) for val and test
    committed: tuple[str, ...] = ()  # id index paths of every committed generation

    def losers_to(self, split: int) -> list[str]:
        return [path for s, path in self.held_out if split_wins(s, split)]


# ------------------------------------------------------------------------------------------------- pack
@dataclass(frozen=True)
class ShardTask:
    split: int
    shard: int
    num_shards: int

    @property
    def file_name(self) -> str:
        return f"{SPLITS[self.split]}-{self.shard:05d}-of-{self.num_shards:05d}.tfrecord"


_SHARD_INTS = ("examples", "tokens", "padding_tokens", "documents", "bytes", "ids_count")
_SHARD_COUNT_TABLES = ("written_per_file", "duplicates_per_file", "duplicates_per_source", "dropped_per_file")
_SHARD_NESTED_TABLES = ("filtered_per_file", "filtered_per_source")  # {name: {name: int}}


@dataclass
class ShardResult:
    task: ShardTask
    path: str  # full path of the written shard
    examples: int
    tokens: int
    padding_tokens: int
    documents: int
    bytes: int
    sha256: str
    sources: dict[str, dict[str, int]] = field(default_factory=dict)  # source -> {documents, tokens}
    written_per_file: dict[str, int] = field(default_factory=dict)  # input path -> documents written
    duplicates_per_file: dict[str, int] = field(default_factory=dict)  # input path -> exact duplicates dropped
    duplicates_per_source: dict[str, int] = field(default_factory=dict)  # source of a dropped copy -> copies
    ids_path: Optional[str] = None  # sorted ids of the documents kept by dedup (the generation's id index)
    ids_count: int = 0  # how many (repeats by a mixture weight count once; dropped ones are still kept)
    dropped_per_file: dict[str, int] = field(default_factory=dict)  # input path -> dropped by a weight < 1
    # source -> {counter: n, or a length histogram} (transforms/shard/corpus_stats.py), of what was written
    source_stats: dict[str, dict[str, int | list[int]]] = field(default_factory=dict)
    # near-dedup / decontamination (transforms/shard/near_dedup/removals.py): input path -> {reason: n}, and
    # reason -> {source: n}
    filtered_per_file: dict[str, dict[str, int]] = field(default_factory=dict)
    filtered_per_source: dict[str, dict[str, int]] = field(default_factory=dict)
    # source -> {counter: n} (transforms/shard/packing_stats.py)
    packing: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict:
        """A packed shard's result without its paths (those follow from its task: `from_json`)."""
        t = self.task
        return {"split": t.split, "shard": t.shard, "num_shards": t.num_shards, "sha256": self.sha256,
                "sources": self.sources, "source_stats": self.source_stats, "packing": self.packing,
                **{k: getattr(self, k) for k in _SHARD_INTS + _SHARD_COUNT_TABLES + _SHARD_NESTED_TABLES}}

    @classmethod
    def from_json(cls, rec: dict, where: Layout) -> "ShardResult":
        """The ShardResult a pack marker describes, its paths made from the task (never read from the marker)."""
        task = ShardTask(_need(rec, "split", int), _need(rec, "shard", int), _need(rec, "num_shards", int))
        if not (0 <= task.split < len(SPLITS) and 0 <= task.shard < task.num_shards <= 99999):
            raise BadRecord("split / shard / num_shards out of range")
        sources = _need(rec, "sources", dict)
        if not all(isinstance(v, dict) for v in sources.values()):
            raise BadRecord("sources is not {source: {documents, tokens}}")
        sha = _need(rec, "sha256", str)
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise BadRecord("sha256 is not a hex digest")
        nested = {}
        for key in _SHARD_NESTED_TABLES:
            table = _need(rec, key, dict)
            nested[key] = {str(k): _counts(v) for k, v in table.items()}
        return cls(
            task, where.path(layout.shard_file(task.file_name)), *(_need(rec, k, int) for k in _SHARD_INTS[:5]), sha,
            sources={k: _counts(v) for k, v in sources.items()},
            **{k: _counts(rec.get(k)) for k in _SHARD_COUNT_TABLES},
            ids_path=where.path(layout.shard_ids(task.file_name)), ids_count=_need(rec, "ids_count", int),
            source_stats=_json_tree(rec.get("source_stats", {})), packing=_json_tree(rec.get("packing", {})),
            **nested)


# ----------------------------------------------------------------------------------------------- commit
@dataclass
class CommitParts:
    """Every stage's results, gathered into one element for the commit (pipeline/shard/shard_pipeline.py)."""
    cuts: list[CutOutput] = field(default_factory=list)
    units: list[UnitResult] = field(default_factory=list)
    shards: list[ShardResult] = field(default_factory=list)

    @classmethod
    def gather(cls, elements: Iterable) -> "CommitParts":
        parts = cls()
        for e in elements:
            if isinstance(e, CutOutput):
                parts.cuts.append(e)
            elif isinstance(e, UnitResult):
                parts.units.append(e)
            elif isinstance(e, ShardResult):
                parts.shards.append(e)
            else:
                raise TypeError(f"not a stage result: {type(e).__name__}")
        return parts
