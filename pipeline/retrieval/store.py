"""Retrieval outputs on disk: the chunk database (Parquet + manifest) and the neighbour sidecar's manifest.

Both are committed by the shard datasets' protocol (pipeline/ops/commit.py: commit_store, through the job
runner pipeline/job.py): files go under a generation directory named by the output's fingerprint, the manifest
is written last in one step (atomic replace locally, one PUT on S3), and only then is any older generation
deleted. A run killed at any moment leaves the previous output or
nothing visible. Manifests are canonical JSON (sorted keys), so equal runs give equal bytes.

Chunk database layout:
    <db>/manifest.json                                     format pileprep.retrieval_db
    <db>/gen-<fp>/chunks-00000-of-00004.parquet            doc_id, chunk_index, source, tokens, token_hash
    <db>/gen-<fp>/embeddings-00000-of-00004.npy            dense encoders: float16 [chunks, dim], row order
    <db>/gen-<fp>/index/trained.faiss, part-00000-of-00004.faiss   dense encoders: index in shards
Dense row ids (Faiss ids) are `first_id + row` of each shard, in shard order.
"""
from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from model_contract.manifest_check import check_manifest_dict
from model_contract.retrieval import DB_FORMAT, DbManifest
from transforms.io import io_utils

NEIGHBOURS_FORMAT = "pileprep.retrieval_neighbours"
MANIFEST_NAME = "manifest.json"


def to_json(d: dict) -> str:
    return json.dumps(d, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def fingerprint(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()[:16]


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def shard_name(prefix: str, k: int, n: int, ext: str) -> str:
    return f"{prefix}-{k:05d}-of-{n:05d}.{ext}"


def contained(rel: str) -> str:
    """A manifest-relative path that stays inside its output directory (refuse '..' and absolute paths)."""
    if rel.startswith("/") or "://" in rel or any(p in ("..", "") for p in rel.split("/")):
        raise ValueError(f"manifest path {rel!r} escapes its output directory")
    return rel


# ------------------------------------------------------------------------------------------------ Parquet
def write_parquet(path: str, rows: dict) -> tuple:
    """Write one database shard; returns (bytes, sha256). Deterministic bytes for equal rows."""
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    table = pa.table({
        "doc_id": pa.array(rows["doc_id"], pa.int64()),
        "chunk_index": pa.array(rows["chunk_index"], pa.int32()),
        "source": pa.array(rows["source"], pa.string()),
        "tokens": pa.array([np.asarray(t, dtype=np.int32) for t in rows["tokens"]], pa.list_(pa.int32())),
        "token_hash": pa.array(rows["token_hash"], pa.int64()),
    })
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", row_group_size=65536, write_statistics=False,
                   use_dictionary=["source"])
    data = buf.getvalue()
    io_utils.write_bytes(path, data)
    return len(data), sha256_of(data)


def read_parquet(path: str, columns=None) -> dict:
    """A database shard as numpy columns; tokens as a list of int32 arrays."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    return table_columns(pq.read_table(io.BytesIO(io_utils.read_bytes(path)), columns=columns))


def table_columns(table) -> dict:
    """A pyarrow table of database rows as numpy columns; tokens as a list of int32 arrays."""
    out = {}
    for name in table.column_names:
        col = table.column(name).combine_chunks()
        if name == "tokens":
            offsets = col.offsets.to_numpy()
            values = col.values.to_numpy()
            out[name] = [values[offsets[i]:offsets[i + 1]] for i in range(len(col))]
        elif name == "source":
            out[name] = col.to_pylist()
        else:
            out[name] = col.to_numpy()
    return out


def write_npy(path: str, array: np.ndarray) -> tuple:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    data = buf.getvalue()
    io_utils.write_bytes(path, data)
    return len(data), sha256_of(data)


def read_npy(path: str) -> np.ndarray:
    return np.load(io.BytesIO(io_utils.read_bytes(path)), allow_pickle=False)


# ------------------------------------------------------------------------------------------------ commit
def read_manifest(output_dir: str, expected_format: str):
    """The committed manifest of a retrieval store, or None: a DbManifest for a chunk database (every field
    checked, model_contract/retrieval.py), the JSON object otherwise."""
    path = io_utils.join(output_dir, MANIFEST_NAME)
    if not io_utils.exists(path):
        return None
    d = json.loads(io_utils.read_bytes(path).decode("utf-8"))
    if d.get("format") != expected_format:
        raise ValueError(f"{path}: not a {expected_format} manifest (format={d.get('format')!r})")
    # Every field, whichever the kind (model_contract/retrieval.py, model_contract/manifest_check.py): a rerun of
    # `retrieval neighbours` onto a hand-edited sidecar refuses it naming the field, as the shard job does its
    # dataset's, instead of planning from it.
    if expected_format == DB_FORMAT:
        return DbManifest.from_dict(d)  # checks every field first (check_db_manifest)
    check_manifest_dict(d)
    return d


# -------------------------------------------------------------------------------------------- database view
@dataclass
class ChunkDatabase:
    """A committed chunk database, loaded for queries (tokens, document ranges, token-hash lookup)."""
    root: str
    manifest: DbManifest
    doc_ids: np.ndarray = field(default=None)  # [N] int64, database order
    chunk_index: np.ndarray = field(default=None)  # [N] int32
    tokens: Optional[list[np.ndarray]] = field(default=None)  # [N] int32 arrays; None: loaded without tokens
    token_hash: np.ndarray = field(default=None)  # [N] int64
    sources: list[str] = field(default=None)  # [N] each chunk's document source

    @classmethod
    def load(cls, root: str, with_tokens: bool = True) -> "ChunkDatabase":
        manifest = read_manifest(root, DB_FORMAT)
        if manifest is None:
            raise FileNotFoundError(f"no chunk database manifest at {root}: run `pileprep retrieval build` first")
        return cls.from_manifest(root, manifest, with_tokens)

    @classmethod
    def from_manifest(cls, root: str, manifest: DbManifest, with_tokens: bool = True) -> "ChunkDatabase":
        """Every shard's columns loaded whole (memory grows with the database; db_rows.py reads by row group)."""
        cols = ["doc_id", "chunk_index", "token_hash", "source"] + (["tokens"] if with_tokens else [])
        parts = [read_parquet(io_utils.join(root, contained(s.path)), cols) for s in manifest.shards]
        db = cls(root, manifest)
        db.doc_ids = np.concatenate([p["doc_id"] for p in parts]) if parts else np.zeros(0, np.int64)
        db.chunk_index = np.concatenate([p["chunk_index"] for p in parts]) if parts else np.zeros(0, np.int32)
        db.token_hash = np.concatenate([p["token_hash"] for p in parts]) if parts else np.zeros(0, np.int64)
        db.sources = [s for p in parts for s in p["source"]]
        db.tokens = [t for p in parts for t in p["tokens"]] if with_tokens else None
        db._build_lookups()
        return db

    def _build_lookups(self) -> None:
        if len(self.doc_ids) and np.any(np.diff(self.doc_ids) < 0):
            raise ValueError(f"{self.root}: database rows are not in document order")
        starts = np.flatnonzero(np.r_[True, self.doc_ids[1:] != self.doc_ids[:-1]]) if len(self.doc_ids) else \
            np.zeros(0, np.int64)
        self.doc_starts = starts
        self.doc_unique = self.doc_ids[starts] if len(starts) else np.zeros(0, np.int64)
        self.doc_ends = np.r_[starts[1:], len(self.doc_ids)] if len(starts) else np.zeros(0, np.int64)
        order = np.argsort(self.token_hash, kind="stable")
        self._hash_sorted = self.token_hash[order]
        self._hash_order = order

    def __len__(self) -> int:
        return len(self.doc_ids)

    def doc_range(self, doc_id: int) -> Optional[tuple]:
        """[lo, hi) dense ids of a document's chunks, or None when it is not in the database."""
        i = np.searchsorted(self.doc_unique, doc_id)
        if i < len(self.doc_unique) and self.doc_unique[i] == doc_id:
            return int(self.doc_starts[i]), int(self.doc_ends[i])
        return None

    def ids_with_hash(self, h: int) -> np.ndarray:
        lo = np.searchsorted(self._hash_sorted, h, "left")
        hi = np.searchsorted(self._hash_sorted, h, "right")
        return np.sort(self._hash_order[lo:hi])

    def with_continuation(self, dense_id: int, length: int, pad_id: int) -> np.ndarray:
        """The chunk and what follows it in its document, padded with pad_id to `length`."""
        return continuation(self.doc_ids, self.tokens, len(self), dense_id, length, pad_id)


def continuation(doc_ids, tokens, total: int, dense_id: int, length: int, pad_id: int) -> np.ndarray:
    """Row `dense_id`'s tokens and its document's following rows', padded with pad_id to `length`; doc_ids and
    tokens are indexed by database row (whole columns, or pipeline/retrieval/db_rows.py's rows read by range)."""
    out = np.full(length, pad_id, dtype=np.int64)
    parts, n, i = [], 0, dense_id
    while n < length and i < total and doc_ids[i] == doc_ids[dense_id]:
        parts.append(tokens[i])
        n += len(tokens[i])
        i += 1
    if parts:
        toks = np.concatenate(parts)[:length]
        out[:len(toks)] = toks
    return out
