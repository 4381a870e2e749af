"""`pileprep retrieval neighbours`: for every chunk of every example of a committed shard generation, the top-k
database chunks (with continuation) from *other* documents, written as a sidecar aligned record for record.

Keyed by the generation, not by a trainer seed, shuffle or data-parallel size: the sidecar is reused by every
training run over that generation (docs/DESIGN.md, "Retrieval keying"). One Beam element per shard: the worker
loads the database, index and encoder once (DoFn.setup), then answers that shard's queries in batches, grouped by
exclusion set.
With BM25 the sidecar is byte-identical for any number of workers; with dense encoders it is compared by
recall and overlap (float sums in Faiss and torch may differ by thread count).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Optional

import apache_beam as beam
import numpy as np

from model_contract import Manifest, RetrievalSpec, ShardInfo, decode_example, frame_record
from model_contract.checked_reader import iter_checked_records
from model_contract.retrieval import (AlignedShard, DbManifest, SidecarInfo, encode_sidecar, sidecar_contract,
                                      token_dtype_for)
from pipeline import job
from pipeline.beam_glue import FilesystemOptions, PlanDoFn, apply_filesystem_options
from pipeline.config import PILEPREP_VERSION
from pipeline.errors import ConfigError
from pipeline.ops import commit
from pipeline.ops.output_names import sidecar_path
from pipeline.retrieval import store, store_job
from pipeline.retrieval.build_index import BM25_QUERY_TERMS, load_bm25
from pipeline.retrieval.build_plan import dataset_identity
from pipeline.retrieval.config import NeighboursConfig
from transforms.io import io_utils
from transforms.retrieval import retrieval_chunks, retrieval_encoders, retrieval_index, retrieval_rerank
from transforms.tokenize import tokenizer
from transforms.retrieval.retrieval_encoders import EncoderInfo, EncoderMismatchError

LOG = logging.getLogger("pileprep.retrieval")
QUERY_BATCH = 256


@dataclasses.dataclass(frozen=True)
class NeighboursPlan:
    config: NeighboursConfig
    dataset_json: str
    db_manifest: DbManifest
    spec: RetrievalSpec
    generation: str
    model_bytes: bytes
    filesystem_options: Optional[FilesystemOptions] = None
    staging_dir: str = ""  # this run's staging (its marker only), set by the job runner (store_job.py)
    previous_generation: Optional[str] = None  # the committed generation the run started from

    @property
    def dataset(self) -> Manifest:
        return Manifest.from_json(self.dataset_json)

    @property
    def data_dir(self) -> str:
        return io_utils.join(self.config.output, self.generation)

    def setup_worker(self) -> None:
        """What every DoFn and Map of the job does first on a worker: the job's S3 settings."""
        apply_filesystem_options(self.filesystem_options)


def query_encoder_info(db_manifest: DbManifest) -> EncoderInfo:
    """The encoder this installation would use for queries, to compare with the database's."""
    return retrieval_encoders.encoder_info(db_manifest.encoder["name"])


def prepare(config: NeighboursConfig) -> NeighboursPlan:
    config.validate()
    manifest_file = io_utils.join(config.dataset, "manifest.json")
    if not io_utils.exists(manifest_file):
        raise ConfigError(f"--dataset {config.dataset}: no manifest.json (run `pileprep shard` first)")
    dataset = commit.require_dataset(Manifest.from_json(io_utils.read_bytes(manifest_file).decode("utf-8")),
                                     f"--dataset {config.dataset}")
    db = store.read_manifest(config.db, store.DB_FORMAT)
    if db is None:
        raise ConfigError(f"--db {config.db}: no chunk database (run `pileprep retrieval build` first)")
    config.validate(db.chunk_len)
    problems = []
    if db.tokenizer["model_sha256"] != dataset.contract.tokenizer.model_sha256:
        problems.append("the chunk database was built with another tokenizer than the dataset's")
    if dataset.contract.seq_len % db.chunk_len:
        problems.append(f"the database's chunk_len {db.chunk_len} does not divide seq_len "
                        f"{dataset.contract.seq_len}")
    if problems:
        raise ConfigError("--db: " + "; ".join(problems))
    try:
        retrieval_encoders.check_encoder(EncoderInfo.from_dict(db.encoder), query_encoder_info(db))
    except EncoderMismatchError as e:
        raise ConfigError(f"--db {config.db}: {e}") from None
    identity = {"dataset": dataset_identity(dataset.to_dict()), "db": db.fingerprint,
                "k": config.num_neighbours, "neighbour_len": config.neighbour_len, "nprobe": config.nprobe,
                "version": PILEPREP_VERSION}
    fp = store.fingerprint(identity)
    spec = RetrievalSpec(db.chunk_len, config.num_neighbours, config.neighbour_len, fingerprint=fp,
                         token_dtype=token_dtype_for(dataset.contract.tokenizer.vocab_size))
    model_bytes = b""
    if db.encoder["name"] != retrieval_encoders.BM25:
        model_bytes = tokenizer.read_model_bytes(dataset.config.get("tokenizer", ""))
    return NeighboursPlan(config, dataset.to_json(), db, spec, "gen-" + fp, model_bytes)


# ------------------------------------------------------------------------------------------ the searcher
class Searcher:
    """Database + index + query encoder, loaded once; answers batches of query chunks with exclusions."""

    def __init__(self, db_root: str, db_manifest: DbManifest, device: str = "cpu", batch_size: int = 64,
                 nprobe: Optional[int] = None, model_bytes: bytes = b"", tokenizer_info=None):
        self.db = store.ChunkDatabase.load(db_root)
        index = db_manifest.index
        self.kind = index["kind"]
        self.batch_size = batch_size
        if self.kind == "bm25":
            self.bm25 = load_bm25(db_root, index)
            self.query_terms = int(index.get("query_terms", BM25_QUERY_TERMS))
        else:
            import faiss  # noqa: PLC0415

            faiss.omp_set_num_threads(1)
            trained = io_utils.read_bytes(io_utils.join(db_root, store.contained(index["trained"]["path"])))
            parts = (io_utils.read_bytes(io_utils.join(db_root, store.contained(s.index_part["path"])))
                     for s in db_manifest.shards if s.index_part is not None)
            self.index = retrieval_index.merge_parts(trained, parts)
            self.nprobe = nprobe or int(index["config"]["nprobe"])
            self.rerank = retrieval_index.IndexConfig.from_dict(index["config"]).rerank
            if self.rerank:  # compressed codes in memory, full vectors read by row from the embeddings files
                self.reranked = retrieval_rerank.RerankedIndex(
                    self.index, retrieval_rerank.ShardedRows(embedding_files(db_root, db_manifest)), self.rerank)
            self.model = retrieval_encoders.load_minilm(device)
            # decoded with the dataset's own tokenizer options (a tiktoken file's pattern and specials: the contract)
            self.sp = tokenizer.load_processor(model_bytes) if tokenizer_info is None else \
                tokenizer.load_for_info(model_bytes, tokenizer_info)

    def exclusion(self, chunk: retrieval_chunks.QueryChunk) -> retrieval_index.Exclusion:
        ranges = tuple(r for r in (self.db.doc_range(d) for d in chunk.doc_ids) if r is not None)
        same = self.db.ids_with_hash(retrieval_chunks.token_hash(chunk.tokens))
        return retrieval_index.Exclusion(ranges, tuple(int(i) for i in same))

    def search(self, chunks: list, k: int) -> np.ndarray:
        """Dense ids [len(chunks), k], -1 = none; padding chunks get none."""
        out = np.full((len(chunks), k), -1, np.int64)
        live = [i for i, c in enumerate(chunks) if not c.is_padding]
        if not live:
            return out
        queries = [chunks[i] for i in live]
        exclusions = [self.exclusion(c) for c in queries]
        if self.kind == "bm25":
            _, ids = self.bm25.search([c.tokens for c in queries], exclusions, k, self.query_terms)
        else:
            texts = [self.sp.decode([int(t) for t in c.tokens]) for c in queries]
            vecs = retrieval_encoders.minilm_encode(self.model, texts, self.batch_size)
            if self.rerank:
                _, ids = self.reranked.search(vecs, exclusions, k, self.nprobe)
            else:
                _, ids = retrieval_index.dense_search(self.index, vecs, exclusions, k, self.nprobe)
        out[live] = ids
        return out


def embedding_files(db_root: str, db_manifest: DbManifest) -> list:
    """[(first row, vectors)] of every shard with embeddings: memory-mapped when local, read once otherwise."""
    out = []
    for s in db_manifest.shards:
        if s.embeddings is None or not s.embeddings.get("rows"):
            continue
        path = io_utils.join(db_root, store.contained(s.embeddings["path"]))
        arr = np.load(path, mmap_mode="r", allow_pickle=False) if io_utils.is_local(path) else store.read_npy(path)
        if arr.ndim != 2 or len(arr) != int(s.embeddings["rows"]):
            raise ValueError(f"{path}: {arr.shape} does not match the manifest's {s.embeddings['rows']} rows")
        out.append((int(s.first_id), arr))
    return out


class NeighbourShard(PlanDoFn):
    """One dataset shard → its sidecar file (same records, same order)."""

    def setup(self):
        super().setup()
        cfg = self.plan.config
        self.searcher = Searcher(cfg.db, self.plan.db_manifest, cfg.device, cfg.batch_size, cfg.nprobe,
                                 self.plan.model_bytes, self.plan.dataset.contract.tokenizer)
        self.pad_id = self.plan.dataset.contract.tokenizer.pad_id

    def process(self, element):
        shard_idx, shard = element
        yield neighbour_shard(self.plan, self.searcher, shard_idx, shard, self.pad_id)


def neighbour_shard(plan: NeighboursPlan, searcher: Searcher, shard_idx: int, shard: dict, pad_id: int) -> dict:
    cfg, spec = plan.config, plan.spec
    src = io_utils.join(cfg.dataset, store.contained(shard["path"]))
    rel = sidecar_path(plan.generation, shard["path"])
    examples = []
    with io_utils.open_read(src) as f:
        for record in iter_checked_records(f, shard):
            examples.append(retrieval_chunks.query_chunks(decode_example(record), spec.chunk_len))
    writer_path = io_utils.join(cfg.output, rel)
    stats = {"chunks": 0, "padding_chunks": 0, "neighbours": 0, "missing": 0}
    with io_utils.open_write(writer_path) as out, io_utils.HashingWriter(out) as hw:
        per = max(1, QUERY_BATCH // max(1, len(examples[0]) if examples else 1))
        for b in range(0, len(examples), per):
            batch = examples[b:b + per]
            flat = [c for ex in batch for c in ex]
            ids = searcher.search(flat, spec.num_neighbours)
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
                        tokens[c, j] = searcher.db.with_continuation(i, spec.neighbour_len, pad_id)
                        doc_ids[c, j] = searcher.db.doc_ids[i]
                        chunk_idx[c, j] = searcher.db.chunk_index[i]
                hw.write(frame_record(encode_sidecar(tokens, doc_ids, chunk_idx, spec.token_dtype)))
    return {"index": shard_idx, "shard": shard["path"], "split": shard["split"], "examples": len(examples),
            "path": rel, "bytes": hw.bytes, "sha256": hw.sha256, "shard_bytes": shard["bytes"], **stats}


def build_sidecar_manifest(plan: NeighboursPlan, results: list) -> Manifest:
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


def commit_sidecar(results: list, plan: NeighboursPlan) -> dict:
    plan.setup_worker()
    manifest = build_sidecar_manifest(plan, results)
    commit.commit_store(plan.config.output, commit.KIND_SIDECAR, manifest.to_dict(),
                        [s.path for s in manifest.shards], plan.previous_generation, plan.staging_dir)
    return manifest.to_dict()


def build_pipeline(p: beam.Pipeline, plan: NeighboursPlan):
    shards = [(i, s.to_dict()) for i, s in enumerate(plan.dataset.shards)]
    return (p | "ListShards" >> beam.Create(shards) | "SpreadShards" >> beam.Reshuffle()
            | "Neighbours" >> beam.ParDo(NeighbourShard(plan))
            | "CollectSidecars" >> beam.combiners.ToList()
            | "Commit" >> beam.Map(commit_sidecar, plan))


SIDECAR_FORMAT = "pileprep.manifest"  # a sidecar's manifest is a pileprep manifest with a retrieval contract


def job_for(config: NeighboursConfig, beam_args=None) -> "store_job.StoreJob":
    """The neighbours job for the job runner (pipeline/job.py): lock, cleanup, commit checks."""
    return store_job.StoreJob(config, beam_args, commit.KIND_SIDECAR, "sidecar", SIDECAR_FORMAT, prepare,
                              build_pipeline)


def run_outcome(config: NeighboursConfig, beam_args=None) -> job.JobOutcome:
    """Compute and commit the neighbour sidecar; the outcome pipeline/retrieval/cli.py formats."""
    return job.run_job(job_for(config, beam_args))


def run(config: NeighboursConfig, beam_args=None) -> dict:
    """Compute and commit the neighbour sidecar; returns its manifest (a pileprep manifest with a retrieval
    contract)."""
    return run_outcome(config, beam_args).manifest
