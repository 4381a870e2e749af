"""`pileprep retrieval build`, its commit: the reconciliation (every piece read is in the database, once), the
database manifest built in one function, and the commit by the shard job's protocol (pipeline/ops/commit.py).
"""
from __future__ import annotations

from model_contract.retrieval import DbManifest, DbShard
from pipeline.config import PILEPREP_VERSION
from pipeline.ops import commit
from pipeline.retrieval.build_plan import BuildPlan, dataset_identity
from transforms.retrieval import retrieval_encoders


class ReconciliationError(RuntimeError):
    """The database does not hold what the shards gave: elements were lost (or doubled) between stages."""


def reconcile(plan: BuildPlan, shard_results: list, read_totals: list) -> None:
    """Refuse to commit a database that does not account for every piece read: each shard file read exactly
    once, every database shard written exactly once, and the documents and tokens read equal to those written.
    A stage that silently drops or repeats elements (tests/e2e/test_threaded_data_plane.py has one) then fails
    the run instead of committing a smaller database."""
    problems = []
    paths = sorted(t["path"] for t in read_totals)
    if paths != sorted(plan.shard_paths):
        problems.append(f"shard files read {len(paths)} (distinct {len(set(paths))}), "
                        f"expected {len(plan.shard_paths)}")
    shards = sorted(r["shard"] for r in shard_results)
    if shards != list(range(plan.config.num_db_shards)):
        problems.append(f"database shards written {shards}, expected 0..{plan.config.num_db_shards - 1} once each")
    for key in ("documents", "tokens"):
        read = sum(t[key] for t in read_totals)
        written = sum(r[key] for r in shard_results)
        if read != written:
            problems.append(f"{key}: read {read} from the shards, {written} in the database")
    if problems:
        raise ReconciliationError("chunk database does not match its dataset, not committed: " + "; ".join(problems))


def build_manifest(plan: BuildPlan, shard_results: list, embeddings=(), trained=None, parts=()) -> DbManifest:
    shards = sorted(shard_results, key=lambda r: r["shard"])
    emb = dict(embeddings)
    part_of = {p["shard"]: p for p in parts}
    first = 0
    out_shards, sources = [], {}
    for r in shards:
        entry = {k: r[k] for k in ("path", "chunks", "documents", "tokens", "bytes", "sha256")}
        entry["first_id"] = first
        if r["shard"] in emb:
            entry["embeddings"] = emb[r["shard"]]
        if r["shard"] in part_of:
            entry["index_part"] = {k: part_of[r["shard"]][k] for k in ("path", "bytes", "sha256", "vectors")}
        first += r["chunks"]
        out_shards.append(entry)
        for s, d in r["sources"].items():
            t = sources.setdefault(s, {"documents": 0, "chunks": 0, "tokens": 0})
            for key in t:
                t[key] += d[key]
    cfg = plan.config
    index = {"kind": "bm25", "params": plan.encoder["params"], **(trained or {})} \
        if cfg.encoder == retrieval_encoders.BM25 else {"kind": "faiss", **(trained or {})}
    return DbManifest(
        kind=commit.KIND_RETRIEVAL_DB,
        pileprep_version=PILEPREP_VERSION,
        generation=plan.generation,
        fingerprint=plan.fingerprint,
        dataset=dataset_identity(plan.dataset_manifest),
        tokenizer=plan.dataset_manifest["contract"]["tokenizer"],
        config=cfg.identity(),
        chunk_len=cfg.chunk_len,
        encoder=plan.encoder,
        index=index,
        shards=tuple(DbShard.from_dict(s) for s in out_shards),
        counts={"chunks": first, "documents": sum(r["documents"] for r in shards),
                "tokens": sum(r["tokens"] for r in shards)},
        sources=sources,
    )


def manifest_files(manifest: DbManifest) -> list:
    files = [s.path for s in manifest.shards]
    files += [s.embeddings["path"] for s in manifest.shards if s.embeddings is not None]
    files += [s.index_part["path"] for s in manifest.shards if s.index_part is not None]
    if manifest.index.get("trained"):
        files.append(manifest.index["trained"]["path"])
    files += [f["path"] for f in manifest.index.get("files", {}).values()]
    return files


def commit_db(shard_results, plan: BuildPlan, embeddings=(), trained=None, parts=(), read_totals=None) -> DbManifest:
    plan.setup_worker()
    if read_totals is not None:
        reconcile(plan, shard_results, read_totals)
    manifest = build_manifest(plan, shard_results, embeddings, trained, parts)
    commit.commit_store(plan.config.output, commit.KIND_RETRIEVAL_DB, manifest.to_dict(), manifest_files(manifest),
                        plan.previous_generation, plan.staging_dir)
    return manifest
