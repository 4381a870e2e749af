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
import re
from typing import Optional

import apache_beam as beam
import numpy as np

from model_contract import Manifest, RetrievalSpec
from model_contract.retrieval import DbManifest, token_dtype_for
from pipeline import job
from pipeline.beam_glue import FilesystemOptions, PlanDoFn, apply_filesystem_options
from pipeline.config import PILEPREP_VERSION
from pipeline.errors import ConfigError
from pipeline.ops import commit
from pipeline.retrieval import neighbours_sharded, store, store_job
from pipeline.retrieval.build_index import BM25_QUERY_TERMS, load_bm25
from pipeline.retrieval.build_plan import dataset_identity
from pipeline.retrieval.config import NeighboursConfig
from pipeline.retrieval.sidecar_files import commit_sidecar, exclusion_for, neighbour_shard
from transforms.io import io_utils
from transforms.retrieval import retrieval_chunks, retrieval_encoders, retrieval_index, retrieval_rerank
from transforms.tokenize import tokenizer
from transforms.retrieval.retrieval_encoders import EncoderInfo, EncoderMismatchError

LOG = logging.getLogger("pileprep.retrieval")


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
    if db.encoder["name"] != retrieval_encoders.BM25:  # dense query vectors depend on batch and device
        identity["encode"] = config.encode_identity()
    if config.ranges:  # the range search's rules (not R: the sidecar must not depend on it)
        check_rangeable(db.index, config.ranges)
        identity["search"] = "ranges"
    fp = store.fingerprint(identity)
    spec = RetrievalSpec(db.chunk_len, config.num_neighbours, config.neighbour_len, fingerprint=fp,
                         token_dtype=token_dtype_for(dataset.contract.tokenizer.vocab_size))
    model_bytes = b""
    if db.encoder["name"] != retrieval_encoders.BM25:
        model_bytes = tokenizer.read_model_bytes(dataset.config.get("tokenizer", ""))
    return NeighboursPlan(config, dataset.to_json(), db, spec, "gen-" + fp, model_bytes)


def check_rangeable(db_index: dict, ranges: int) -> None:
    """Only an IVF index has inverted lists to cut into ranges (--ranges), at most one range per list (each
    range file is a copy of the trained index: more ranges than lists are empty files, R of them)."""
    spec = db_index.get("config", {}).get("spec", "") if db_index.get("kind") == "faiss" else ""
    nlist = re.search(r"IVF(\d+)", spec)
    if nlist is None:
        what = "BM25 postings" if db_index.get("kind") == "bm25" else f"index {spec!r}"
        raise ConfigError(f"--ranges: the database's {what} has no inverted lists to cut into ranges "
                          "(build it with --index IVF<n>,... or leave --ranges at 0)")
    if ranges > int(nlist.group(1)):
        raise ConfigError(f"--ranges {ranges}: the database's index {spec!r} has {nlist.group(1)} inverted lists "
                          "to cut; use at most that many ranges")


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
        return exclusion_for(self.db, chunk)

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
        k = self.plan.spec.num_neighbours
        yield neighbour_shard(self.plan, self.searcher.db, shard_idx, shard, self.pad_id,
                              lambda _first, batch: self.searcher.search([c for ex in batch for c in ex], k))


def build_pipeline(p: beam.Pipeline, plan: NeighboursPlan):
    if plan.config.ranges:
        return neighbours_sharded.build_pipeline(p, plan)
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
