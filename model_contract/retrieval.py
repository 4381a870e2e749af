"""The retrieval sidecar's contract: neighbours per training chunk, aligned record for record with a shard
generation, declared as their own features (the shards' features and `tf_feature_spec` are unchanged).

One sidecar record per shard record, same order, in a file per shard:
    neighbour_tokens       bytes   [n_chunks, k, neighbour_len] little-endian uint16 (int32 if the vocabulary
                                   needs it): each neighbour chunk followed by its continuation, pad_id-filled
    neighbour_doc_ids      int64   [n_chunks, k]  database document id of each neighbour, -1 = none
    neighbour_chunk_index  int64   [n_chunks, k]  database chunk index inside that document, -1 = none
n_chunks = seq_len / chunk_len. A padding chunk (all padding) has no neighbours: ids -1, tokens pad_id.

Cost: [32, 2, 128] uint16 per 2,048-token example is 16 KiB, about 1.3x the example's own ~12 KiB of varint
features (the figure `storage` in the sidecar manifest states for each run).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from model_contract.contract import (NEIGHBOUR_CHUNK_INDEX, NEIGHBOUR_DOC_IDS, NEIGHBOUR_TOKENS,
                                     ContractError, ContractMismatchError, DataContract, FeatureSpec, RetrievalSpec,
                                     TokenizerInfo)
from model_contract.example_codec import _TAG1, _TAG2, _TAG3, _length, decode_example, encode_varints
from model_contract.schema import Fields, check_generation_name, check_relative_path

SIDECAR_FEATURES = (NEIGHBOUR_TOKENS, NEIGHBOUR_DOC_IDS, NEIGHBOUR_CHUNK_INDEX)


def token_dtype_for(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "int32"


def sidecar_contract(seq_len: int, tokenizer: TokenizerInfo, spec: RetrievalSpec) -> DataContract:
    n = seq_len // spec.chunk_len
    k = spec.num_neighbours
    features = (
        FeatureSpec(NEIGHBOUR_TOKENS, spec.token_dtype, (n, k, spec.neighbour_len),
                    f"neighbour chunk + continuation tokens, raw little-endian {spec.token_dtype} bytes"),
        FeatureSpec(NEIGHBOUR_DOC_IDS, "int64", (n, k), "database document id of each neighbour, -1 = none"),
        FeatureSpec(NEIGHBOUR_CHUNK_INDEX, "int64", (n, k), "chunk index in that document, -1 = none"),
    )
    return DataContract(seq_len=seq_len, tokenizer=tokenizer, features=features, retrieval=spec)


def _bytes_entry(name: str, data: bytes) -> bytes:
    key = name.encode("utf-8")
    key_field = _TAG1 + _length(len(key)) + key
    bytes_list = _TAG1 + _length(len(data)) + data  # BytesList.value = 1
    feature = _TAG1 + _length(len(bytes_list)) + bytes_list  # Feature.bytes_list = 1
    entry = key_field + _TAG2 + _length(len(feature)) + feature
    return _TAG1 + _length(len(entry)) + entry


def _int64_entry(name: str, values: np.ndarray) -> bytes:
    key = name.encode("utf-8")
    packed = encode_varints(np.asarray(values, np.int64).ravel())
    int64_list = _TAG1 + _length(len(packed)) + packed if packed else b""
    feature = _TAG3 + _length(len(int64_list)) + int64_list
    entry = _TAG1 + _length(len(key)) + key + _TAG2 + _length(len(feature)) + feature
    return _TAG1 + _length(len(entry)) + entry


def encode_sidecar(tokens: np.ndarray, doc_ids: np.ndarray, chunk_index: np.ndarray, token_dtype: str) -> bytes:
    """One sidecar record as a tf.train.Example (features in sorted key order: reproducible bytes)."""
    raw = np.ascontiguousarray(tokens, dtype=np.dtype(token_dtype).newbyteorder("<")).tobytes()
    parts = {NEIGHBOUR_CHUNK_INDEX: _int64_entry(NEIGHBOUR_CHUNK_INDEX, chunk_index),
             NEIGHBOUR_DOC_IDS: _int64_entry(NEIGHBOUR_DOC_IDS, doc_ids),
             NEIGHBOUR_TOKENS: _bytes_entry(NEIGHBOUR_TOKENS, raw)}
    body = b"".join(parts[name] for name in sorted(parts))
    return _TAG1 + _length(len(body)) + body


def decode_sidecar(data: bytes, contract: DataContract) -> dict:
    """{feature: np.ndarray shaped as declared}; tokens widened to int64 for the model."""
    raw = decode_example(data)
    out = {}
    for f in contract.features:
        if f.name == NEIGHBOUR_TOKENS:
            arr = np.frombuffer(raw[f.name][0], dtype=np.dtype(f.dtype).newbyteorder("<")).astype(np.int64)
        else:
            arr = np.asarray(raw[f.name], np.int64)
        out[f.name] = arr.reshape(f.shape)
    return out


def check_sidecar(shards_manifest, sidecar_manifest) -> None:
    """The sidecar must belong to exactly this shard generation, file for file and record for record."""
    problems = []
    info = sidecar_manifest.retrieval  # None: not a sidecar at all (then nothing below matches)
    built_for = None if info is None else info.dataset_generation
    gen = shards_manifest.generation
    if built_for != gen:
        problems.append(f"retrieval sidecar: built for generation {built_for}, the dataset "
                        f"is {gen} (run `pileprep retrieval neighbours` for the new generation)")
    want = [(s.path, s.examples) for s in shards_manifest.shards]
    got = [] if info is None else [(a.shard, a.examples) for a in info.aligned]
    if not problems and want != got:
        problems.append("retrieval sidecar: its files do not align with the dataset's shards record for record")
    if sidecar_manifest.contract.tokenizer.model_sha256 != shards_manifest.contract.tokenizer.model_sha256:
        problems.append("retrieval sidecar: built with another tokenizer than the dataset's")
    if problems:
        raise ContractMismatchError(problems)


# ------------------------------------------------------------------------------------------- manifests
# The sidecar manifest is a pileprep manifest (model_contract/manifest.py) whose `retrieval` section is a
# SidecarInfo; the chunk database's manifest is its own format, a DbManifest checked by `check_db_manifest`.
# Both are checked on load, every field, naming its path (model_contract/schema.py).
DB_FORMAT = "pileprep.retrieval_db"


@dataclass(frozen=True)
class AlignedShard:
    """One `retrieval.aligned` row: the sidecar file holding a shard's neighbours, record for record."""
    shard: str
    examples: int
    sidecar: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict, prefix: str) -> "AlignedShard":
        f = Fields(d, prefix)
        for key in ("shard", "sidecar"):
            check_relative_path(f.string(key), f.path(key))
        return cls(shard=d["shard"], examples=f.count("examples"), sidecar=d["sidecar"])


@dataclass(frozen=True)
class SidecarInfo:
    """The sidecar manifest's `retrieval` section: what the neighbours were built from and for."""
    fingerprint: str
    dataset_generation: Optional[str]
    aligned: tuple[AlignedShard, ...]  # in shard order
    # the `db` JSON: {fingerprint, generation, encoder, index} of the chunk database (pipeline/retrieval/neighbours.py)
    db: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # chunks, padding_chunks, neighbours, missing
    # the `storage` JSON: sidecar_bytes, shard_bytes (int), ratio_to_shards (float), token_dtype (str)
    storage: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"fingerprint": self.fingerprint, "dataset_generation": self.dataset_generation,
                "aligned": [a.to_dict() for a in self.aligned], "db": self.db, "counts": self.counts,
                "storage": self.storage}

    @classmethod
    def from_dict(cls, d: dict, prefix: str = "retrieval") -> "SidecarInfo":
        f = Fields(d, prefix)
        f.string("fingerprint")
        gen = d.get("dataset_generation")
        if gen is not None:
            check_generation_name(gen, f.path("dataset_generation"))
        aligned = tuple(AlignedShard.from_dict(row, path) for path, row in f.items("aligned"))
        db = f.obj("db", required=False)
        db.string("fingerprint", required=False)
        if db.d.get("generation") is not None:
            check_generation_name(db.d["generation"], db.path("generation"))
        counts = f.counts("counts", required=False)
        storage = f.obj("storage", required=False)
        storage.count("sidecar_bytes", required=False)
        storage.count("shard_bytes", required=False)
        storage.number("ratio_to_shards", required=False, lo=0)
        storage.string("token_dtype", required=False)
        return cls(fingerprint=d["fingerprint"], dataset_generation=gen, aligned=aligned, db=db.d, counts=counts,
                   storage=storage.d)


@dataclass(frozen=True)
class DbShard:
    """A chunk database manifest's `shards` row: one Parquet file of chunks in database order and, for a dense
    encoder, its embeddings and index part ({path, bytes, sha256, rows | vectors})."""
    path: str
    chunks: int
    documents: int
    tokens: int
    bytes: int
    sha256: str
    first_id: int  # the database row (the Faiss id) of its first chunk
    # the `embeddings` and `index_part` JSON file entries: {path, sha256: str; bytes, rows | vectors: int}
    embeddings: Optional[dict[str, Any]] = None
    index_part: Optional[dict[str, Any]] = None

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict) -> "DbShard":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


# DbManifest's fields written only when set (None: absent), in the order pipeline/retrieval/build.py sets them.
_DB_OPTIONAL = ("kind", "pileprep_version", "dataset", "tokenizer", "config", "encoder", "counts", "sources")


@dataclass(frozen=True)
class DbManifest:
    """A chunk database's manifest (pipeline/retrieval/build_manifest.py `build_manifest`); `from_dict` checks every
    field first (`check_db_manifest`), `to_dict` writes the same JSON back, keys it does not know included."""
    generation: str
    fingerprint: str
    chunk_len: int
    index: dict[str, Any]  # the `index` JSON: {kind: bm25, params, files} or {kind: faiss, config, trained}
    shards: tuple[DbShard, ...]  # in database order
    kind: Optional[str] = None  # pipeline/ops/commit.py: KIND_RETRIEVAL_DB
    pileprep_version: Optional[str] = None
    # the `dataset` JSON: the shard generation it was built from (pipeline/retrieval/build_plan.py dataset_identity)
    dataset: Optional[dict[str, Any]] = None
    tokenizer: Optional[dict[str, Any]] = None  # the dataset contract's `tokenizer` JSON (TokenizerInfo.to_dict)
    config: Optional[dict[str, Any]] = None  # the `config` JSON (pipeline/retrieval/config.py BuildConfig.identity)
    # the `encoder` JSON {name, ...}: transforms/retrieval/retrieval_encoders.py EncoderInfo
    encoder: Optional[dict[str, Any]] = None
    counts: Optional[dict[str, int]] = None  # chunks, documents, tokens
    sources: Optional[dict[str, dict[str, int]]] = None  # source -> {documents, chunks, tokens}
    extra: dict[str, Any] = field(default_factory=dict)  # keys this reader does not know, kept as JSON

    def to_dict(self) -> dict:
        d = {"format": DB_FORMAT, "generation": self.generation, "fingerprint": self.fingerprint,
             "chunk_len": self.chunk_len, "index": self.index, "shards": [s.to_dict() for s in self.shards]}
        d.update({k: getattr(self, k) for k in _DB_OPTIONAL if getattr(self, k) is not None})
        d.update({k: v for k, v in self.extra.items() if k not in d})
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DbManifest":
        check_db_manifest(d)
        known = {"format", "generation", "fingerprint", "chunk_len", "index", "shards", *_DB_OPTIONAL}
        return cls(generation=d["generation"], fingerprint=d["fingerprint"], chunk_len=d["chunk_len"],
                   index=d["index"], shards=tuple(DbShard.from_dict(s) for s in d["shards"]),
                   **{k: d[k] for k in _DB_OPTIONAL if k in d}, extra={k: v for k, v in d.items() if k not in known})


def _check_file_entry(f: Fields, key: str, extra_counts=()) -> None:
    entry = f.obj(key)
    check_relative_path(entry.string("path"), entry.path("path"))
    entry.count("bytes")
    entry.sha256("sha256")
    for name in extra_counts:
        entry.count(name, required=False)


def check_db_manifest(d, what: str = "retrieval database manifest") -> dict:
    """Every field of a chunk database manifest (pipeline/retrieval/build_manifest.py `build_manifest`); returns it."""
    f = Fields(d, "", what)
    if d.get("format") != DB_FORMAT:
        raise ContractError(f"not a {DB_FORMAT} manifest (format={d.get('format')!r})")
    f.string("pileprep_version", required=False)
    check_generation_name(d.get("generation"), "generation")
    f.string("fingerprint")
    f.positive("chunk_len")
    for key in ("dataset", "tokenizer", "config", "encoder"):
        f.obj(key, required=False)
    index = f.obj("index")
    index.string("kind")
    if "trained" in index.d:
        _check_file_entry(index, "trained")
    for name in index.obj("files", required=False).d:
        _check_file_entry(index.obj("files"), name)
    for path, row in f.items("shards"):
        s = Fields(row, path, what)
        check_relative_path(s.string("path"), s.path("path"))
        for name in ("chunks", "documents", "tokens", "bytes", "first_id"):
            s.count(name)
        s.sha256("sha256")
        if "embeddings" in row:
            _check_file_entry(s, "embeddings", ("rows",))
        if "index_part" in row:
            _check_file_entry(s, "index_part", ("vectors",))
    f.counts("counts", required=False)
    for source in f.obj("sources", required=False).d:
        f.obj("sources").counts(source)
    return d
