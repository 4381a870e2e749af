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

import numpy as np

from model_contract.contract import (NEIGHBOUR_CHUNK_INDEX, NEIGHBOUR_DOC_IDS, NEIGHBOUR_TOKENS,
                                     ContractMismatchError, DataContract, FeatureSpec, RetrievalSpec,
                                     TokenizerInfo)
from model_contract.example_codec import _TAG1, _TAG2, _TAG3, _length, decode_example, encode_varints

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


def sidecar_tf_feature_spec(contract: DataContract) -> dict:
    """tf.io.parse_example spec (tokens arrive as a string: tf.io.decode_raw(x, tf.uint16) then reshape)."""
    import tensorflow as tf  # noqa: PLC0415

    return {f.name: (tf.io.FixedLenFeature([], tf.string) if f.name == NEIGHBOUR_TOKENS
                     else tf.io.FixedLenFeature(list(f.shape), tf.int64)) for f in contract.features}


def check_sidecar(shards_manifest, sidecar_manifest) -> None:
    """The sidecar must belong to exactly this shard generation, file for file and record for record."""
    problems = []
    info = sidecar_manifest.extra.get("retrieval", {})
    gen = shards_manifest.generation
    if info.get("dataset_generation") != gen:
        problems.append(f"retrieval sidecar: built for generation {info.get('dataset_generation')}, the dataset "
                        f"is {gen} (run `pileprep retrieval neighbours` for the new generation)")
    want = [(s.path, s.examples) for s in shards_manifest.shards]
    got = [(a.get("shard"), a.get("examples")) for a in info.get("aligned", [])]
    if not problems and want != got:
        problems.append("retrieval sidecar: its files do not align with the dataset's shards record for record")
    if sidecar_manifest.contract.tokenizer.model_sha256 != shards_manifest.contract.tokenizer.model_sha256:
        problems.append("retrieval sidecar: built with another tokenizer than the dataset's")
    if problems:
        raise ContractMismatchError(problems)
