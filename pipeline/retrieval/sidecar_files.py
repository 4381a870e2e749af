"""The sidecar's files and manifest, shared by both ways of searching (pipeline/retrieval/neighbours.py: one
worker holds the index; pipeline/retrieval/neighbours_sharded.py: the index searched in ranges): a shard's query
chunks, their exclusions, the sidecar file of a shard (record i = neighbours of the shard's record i) and the
commit. `plan` is a neighbours.NeighboursPlan.
"""
from __future__ import annotations

import numpy as np

from model_contract import Manifest, ShardInfo, decode_example, frame_record
from model_contract.checked_reader import iter_checked_records
from model_contract.retrieval import AlignedShard, SidecarInfo, encode_sidecar, sidecar_contract
from pipeline.config import PILEPREP_VERSION
from pipeline.ops import commit
from pipeline.ops.output_names import sidecar_path
from pipeline.retrieval import db_rows, store
from transforms.io import io_utils
from transforms.retrieval import retrieval_chunks, retrieval_index

QUERY_BATCH = 256


def exclusion_for(db: store.ChunkDatabase, chunk: retrieval_chunks.QueryChunk) -> retrieval_index.Exclusion:
    """The rows a query chunk must not get: its documents' rows and the rows of chunks with its tokens."""
    ranges = tuple(r for r in (db.doc_range(d) for d in chunk.doc_ids) if r is not None)
    same = db.ids_with_hash(retrieval_chunks.token_hash(chunk.tokens))
    return retrieval_index.Exclusion(ranges, tuple(int(i) for i in same))


def shard_query_chunks(plan, shard: dict) -> list:
    """Per record of a dataset shard, its query chunks (retrieval_chunks.query_chunks), in record order."""
    src = io_utils.join(plan.config.dataset, store.contained(shard["path"]))
    with io_utils.open_read(src) as f:
        return [retrieval_chunks.query_chunks(decode_example(record), plan.spec.chunk_len)
                for record in iter_checked_records(f, shard)]


def neighbour_shard(plan, db: store.ChunkDatabase | db_rows.NeededRows, shard_idx: int, shard: dict, pad_id: int,
                    search) -> dict:
    """One shard's sidecar file; `search(first record, records' chunks)` gives database rows [chunks, k]."""
    cfg, spec = plan.config, plan.spec
    rel = sidecar_path(plan.generation, shard["path"])
    examples = shard_query_chunks(plan, shard)
    writer_path = io_utils.join(cfg.output, rel)
    stats = {"chunks": 0, "padding_chunks": 0, "neighbours": 0, "missing": 0}
    with io_utils.open_write(writer_path) as out, io_utils.HashingWriter(out) as hw:
        per = max(1, QUERY_BATCH // max(1, len(examples[0]) if examples else 1))
        for b in range(0, len(examples), per):
            batch = examples[b:b + per]
            ids = search(b, batch)
            pos = 0
            for ex in batch:
                n = len(ex)
                ex_ids = ids[pos:pos + n]
                pos += n
                tokens = np.full((n, spec.num_neighbours, spec.neighbour_len), pad_id, np.int64)
                doc_ids = np.full((n, spec.num_neighbours), -1, np.int64)
                chunk_idx = np.full((n, spec.num_neighbours), -1, np.int64)
                for c in range(n):
                    stats["chunks"] += 1
                    stats["padding_chunks"] += int(ex[c].is_padding)
                    for j in range(spec.num_neighbours):
                        i = int(ex_ids[c, j])
                        if i < 0:
                            stats["missing"] += int(not ex[c].is_padding)
                            continue
                        stats["neighbours"] += 1
                        tokens[c, j] = db.with_continuation(i, spec.neighbour_len, pad_id)
                        doc_ids[c, j] = db.doc_ids[i]
                        chunk_idx[c, j] = db.chunk_index[i]
                hw.write(frame_record(encode_sidecar(tokens, doc_ids, chunk_idx, spec.token_dtype)))
    return {"index": shard_idx, "shard": shard["path"], "split": shard["split"], "examples": len(examples),
            "path": rel, "bytes": hw.bytes, "sha256": hw.sha256, "shard_bytes": shard["bytes"], **stats}


def build_sidecar_manifest(plan, results: list) -> Manifest:
    results = sorted(results, key=lambda r: r["index"])
    dataset = plan.dataset
    spec = plan.spec
    contract = sidecar_contract(dataset.contract.seq_len, dataset.contract.tokenizer, spec)
    shards = [ShardInfo(path=r["path"], split=r["split"], examples=r["examples"],
                        tokens=r["examples"] * (dataset.contract.seq_len // spec.chunk_len) * spec.num_neighbours
                        * spec.neighbour_len, padding_tokens=0, documents=0, bytes=r["bytes"], sha256=r["sha256"])
              for r in results]
    side_bytes = sum(r["bytes"] for r in results)
    shard_bytes = sum(r["shard_bytes"] for r in results)
    totals = {k: sum(r[k] for r in results) for k in ("chunks", "padding_chunks", "neighbours", "missing")}
    retrieval = SidecarInfo(
        fingerprint=spec.fingerprint, dataset_generation=dataset.generation,
        db={"fingerprint": plan.db_manifest.fingerprint, "generation": plan.db_manifest.generation,
            "encoder": plan.db_manifest.encoder, "index": {k: v for k, v in plan.db_manifest.index.items()
                                                           if k in ("kind", "config", "query_terms")}},
        aligned=tuple(AlignedShard(shard=r["shard"], examples=r["examples"], sidecar=r["path"]) for r in results),
        counts=totals,
        storage={"sidecar_bytes": side_bytes, "shard_bytes": shard_bytes,
                 "ratio_to_shards": round(side_bytes / shard_bytes, 4) if shard_bytes else 0.0,
                 "token_dtype": spec.token_dtype},
    )
    config = {"num_neighbours": plan.config.num_neighbours, "neighbour_len": plan.config.neighbour_len,
              "nprobe": plan.config.nprobe}
    return Manifest(contract=contract, shards=shards, config=config,
                    pileprep_version=PILEPREP_VERSION,
                    generation=plan.generation, kind=commit.KIND_SIDECAR, retrieval=retrieval)


def commit_sidecar(results: list, plan) -> dict:
    plan.setup_worker()
    manifest = build_sidecar_manifest(plan, results)
    commit.commit_store(plan.config.output, commit.KIND_SIDECAR, manifest.to_dict(),
                        [s.path for s in manifest.shards], plan.previous_generation, plan.staging_dir)
    return manifest.to_dict()
