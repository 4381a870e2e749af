"""`pileprep retrieval build`: a committed shard dataset → chunk database (+ embeddings + index) → manifest.

Documents are re-assembled from the shards' provenance (`piece_doc_ids` / `piece_offsets`), so the database
holds exactly the tokens the trainer sees, with no second tokenization. Each document's source is joined from
the dataset's input files (a JSON parse, no tokenizing). Wiring only; the work is in
transforms/retrieval/retrieval_chunks.py (chunks), transforms/retrieval/retrieval_encoders.py (encoders, the RunInference model
handler) and transforms/retrieval/retrieval_index.py (Faiss). Every name and order derives from document ids and the
config, so the database is byte-identical for any number of workers and any runner.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Optional

import apache_beam as beam
import numpy as np
from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, RunInference

from model_contract import decode_example
from model_contract.retrieval import DbManifest, DbShard
from model_contract.contract import TokenizerInfo
from model_contract.checked_reader import iter_checked_records
from pipeline.ops.output_names import shard_entry
from pipeline import job
from pipeline.beam_glue import FilesystemOptions, PlanDoFn, apply_filesystem_options
from pipeline.config import PILEPREP_VERSION, ConfigError
from pipeline.ops import commit
from pipeline.retrieval import store, store_job
from pipeline.retrieval.config import BuildConfig
from transforms.io import io_utils
from transforms.retrieval import retrieval_chunks, retrieval_encoders, retrieval_index
from transforms.tokenize import tokenizer
from transforms.shard.documents import DEAD_LETTER, FILTERED, parse_record
from transforms.io.read_records import FileDamage, compression_of, iter_raw_records

LOG = logging.getLogger("pileprep.retrieval")
UNKNOWN_SOURCE = ""


@dataclasses.dataclass(frozen=True)
class BuildPlan:
    config: BuildConfig
    dataset_manifest: dict
    shard_paths: tuple  # absolute paths of the shards of the chosen splits
    input_paths: tuple  # the dataset's input files (for sources)
    generation: str
    fingerprint: str
    encoder: dict  # EncoderInfo dict
    model_bytes: bytes  # the dataset's tokenizer (dense encoders decode chunk text)
    filesystem_options: Optional[FilesystemOptions] = None
    staging_dir: str = ""  # this run's staging (its marker only), set by the job runner (store_job.py)
    previous_generation: Optional[str] = None  # the committed generation the run started from

    @property
    def data_dir(self) -> str:
        return io_utils.join(self.config.output, self.generation)

    def setup_worker(self) -> None:
        """What every DoFn and Map of the job does first on a worker: the job's S3 settings."""
        apply_filesystem_options(self.filesystem_options)


def dataset_identity(manifest: dict) -> dict:
    return {"generation": manifest.get("generation"), "tokenizer": manifest["contract"]["tokenizer"]["model_sha256"],
            "seq_len": manifest["contract"]["seq_len"],
            "shards": [(s["path"], s["sha256"]) for s in manifest["shards"]]}


def prepare(config: BuildConfig) -> BuildPlan:
    config.validate()
    manifest_file = io_utils.join(config.dataset, "manifest.json")
    if not io_utils.exists(manifest_file):
        raise ConfigError(f"--dataset {config.dataset}: no manifest.json (run `pileprep shard` first)")
    # Every field checked on load, local or not (it was plain JSON on object stores), and a dataset's.
    manifest = commit.require_dataset(commit.read_committed(config.dataset), f"--dataset {config.dataset}").to_dict()
    if manifest["contract"]["seq_len"] % config.chunk_len:
        raise ConfigError(f"--chunk-len {config.chunk_len} does not divide the dataset's seq_len "
                          f"{manifest['contract']['seq_len']}")
    shards = tuple(io_utils.join(config.dataset, store.contained(s["path"])) for s in manifest["shards"]
                   if s["split"] in config.splits)
    inputs = tuple(row["path"] for row in manifest.get("ledger", manifest.get("inputs", []))) if config.sources \
        else ()
    encoder = retrieval_encoders.encoder_info(config.encoder)
    tok_path = manifest["config"].get("tokenizer", "")
    model_bytes = b""
    if config.encoder != retrieval_encoders.BM25:
        model_bytes = tokenizer.read_model_bytes(tok_path)
    identity = {"dataset": dataset_identity(manifest), "config": config.identity(), "encoder": encoder.to_dict(),
                "version": PILEPREP_VERSION}
    fp = store.fingerprint(identity)
    return BuildPlan(config, manifest, shards, inputs, "gen-" + fp, fp, encoder.to_dict(), model_bytes)


# --------------------------------------------------------------------------------------------- read stages
READ_TOTALS = "read_totals"


class ReconciliationError(RuntimeError):
    """The database does not hold what the shards gave: elements were lost (or doubled) between stages."""


class ReadPieces(PlanDoFn):
    """One shard file → (doc_id, (offset, tokens)) for every document piece in it, and on the READ_TOTALS
    output one {"path", "pieces", "tokens", "documents"} for the file: what the database must account for
    (reconcile). A document's piece at offset 0 counts it once."""

    def process(self, path):
        fraction = self.plan.config.doc_fraction
        limit = int(fraction * retrieval_chunks.DOC_ID_SPACE)
        pieces = tokens = documents = 0
        with io_utils.open_read(path) as f:
            for record in iter_checked_records(f, shard_entry(self.plan.dataset_manifest, self.plan.config.dataset,
                                                              path)):
                for piece in retrieval_chunks.pieces_of_example(decode_example(record)):
                    if fraction < 1.0 and piece.doc_id >= limit:
                        continue
                    pieces += 1
                    tokens += len(piece.tokens)
                    documents += int(piece.offset == 0)
                    yield piece.doc_id, (piece.offset, piece.tokens.astype(np.int32))
        yield beam.pvalue.TaggedOutput(READ_TOTALS, {"path": path, "pieces": pieces, "tokens": tokens,
                                                     "documents": documents})


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


class ReadSources(PlanDoFn):
    """One input file → (doc_id, source) for every document in it (damaged lines are the shard job's business)."""

    def process(self, path):
        cfg = self.plan.dataset_manifest["config"]
        text_field = cfg.get("text_field", "text")
        source_fields = tuple(cfg.get("source_fields", ("meta.pile_set_name",)))
        try:
            stream = io_utils.open_read(path)
        except Exception as e:  # noqa: BLE001 - a moved input only costs the source column
            LOG.warning("%s: cannot read it for sources (%s); its documents get source ''", path, e)
            return
        with stream:
            for item in iter_raw_records(stream, compression_of(path)):
                if isinstance(item, FileDamage):
                    continue
                doc = parse_record(item.data, text_field, source_fields)
                if getattr(doc, "kind", None) in (FILTERED, DEAD_LETTER):
                    continue
                yield doc.doc_id, doc.source


def assemble(element):
    doc_id, grouped = element
    pieces, sources = grouped["pieces"], grouped["sources"]
    if not pieces:
        return  # a document of another split, or filtered out of the dataset
    tokens = retrieval_chunks.assemble_document(doc_id, pieces)
    source = min(sources) if sources else UNKNOWN_SOURCE  # duplicates under two sources: one deterministic pick
    yield doc_id, source, tokens


class WriteDbShard(PlanDoFn):
    """One database shard's documents → its Parquet file; yields the shard's manifest entry."""

    def process(self, element):
        k, documents = element
        cfg = self.plan.config
        rows = retrieval_chunks.db_rows(documents, cfg.chunk_len)
        rel = f"{self.plan.generation}/" + store.shard_name("chunks", k, cfg.num_db_shards, "parquet")
        nbytes, sha = store.write_parquet(io_utils.join(cfg.output, rel), rows)
        sources: dict = {}
        for s, toks, ci in zip(rows["source"], rows["tokens"], rows["chunk_index"]):
            d = sources.setdefault(s, {"documents": 0, "chunks": 0, "tokens": 0})
            d["chunks"] += 1
            d["tokens"] += len(toks)
            d["documents"] += int(ci == 0)
        yield {"shard": k, "path": rel, "chunks": len(rows["doc_id"]), "documents": len(set(rows["doc_id"])),
               "tokens": int(sum(len(t) for t in rows["tokens"])), "bytes": nbytes, "sha256": sha,
               "sources": sources}


def empty_shards(results: list, num: int) -> list:
    """Shard numbers no document fell into (they still get an empty file: the layout is fixed)."""
    have = {r["shard"] for r in results}
    return [(k, []) for k in range(num) if k not in have]


# --------------------------------------------------------------------------------------------- dense stages
class MiniLMHandler(ModelHandler):
    """RunInference handler: loads all-MiniLM-L6-v2 once per worker; batches of chunk texts → unit vectors."""

    def __init__(self, device: str = "cpu", batch_size: int = 64):
        super().__init__()
        self.device = device
        self.batch_size = batch_size

    def load_model(self):
        import torch  # noqa: PLC0415

        torch.set_num_threads(1)
        return retrieval_encoders.load_minilm(self.device)

    def run_inference(self, batch, model, inference_args=None):
        from apache_beam.ml.inference.base import PredictionResult  # noqa: PLC0415

        vecs = retrieval_encoders.minilm_encode(model, batch, self.batch_size)
        return [PredictionResult(x, v) for x, v in zip(batch, vecs)]

    def batch_elements_kwargs(self):
        return {"min_batch_size": 1, "max_batch_size": self.batch_size}

    def share_model_across_processes(self) -> bool:
        return False


class ChunkTexts(PlanDoFn):
    """A written database shard → ((shard, row), decoded chunk text) for the encoder."""

    def setup(self):
        super().setup()
        # the dataset's own tokenizer options (a tiktoken file's pattern and specials live in the contract)
        info = TokenizerInfo.from_dict(self.plan.dataset_manifest["contract"]["tokenizer"])
        self.sp = tokenizer.load_for_info(self.plan.model_bytes, info)

    def process(self, result):
        rows = store.read_parquet(io_utils.join(self.plan.config.output, result["path"]), ["tokens"])
        for r, toks in enumerate(rows["tokens"]):
            yield (result["shard"], r), self.sp.decode([int(t) for t in toks])


def write_embeddings(element, plan: BuildPlan):
    plan.setup_worker()
    k, rows = element
    rows = sorted(rows, key=lambda r: r[0])
    vecs = np.stack([v for _, v in rows]).astype(np.float32) if rows else \
        np.zeros((0, retrieval_encoders.MINILM_DIM), np.float32)
    rel = f"{plan.generation}/" + store.shard_name("embeddings", k, plan.config.num_db_shards, "npy")
    nbytes, sha = store.write_npy(io_utils.join(plan.config.output, rel), vecs)
    return k, {"path": rel, "bytes": nbytes, "sha256": sha, "rows": len(vecs)}


BM25_ARRAYS = ("vocab", "data", "indices", "indptr", "num_chunks")
BM25_QUERY_TERMS = 8


def build_bm25(shard_results: list, plan: BuildPlan) -> dict:
    """The BM25 postings over every chunk, in database order, as plain .npy files (deterministic bytes)."""
    plan.setup_worker()
    tokens = []
    for r in sorted(shard_results, key=lambda r: r["shard"]):
        tokens += store.read_parquet(io_utils.join(plan.config.output, r["path"]), ["tokens"])["tokens"]
    arrays = retrieval_encoders.BM25Scorer.build(tokens).arrays()
    files = {}
    for name in BM25_ARRAYS:
        rel = f"{plan.generation}/index/bm25-{name}.npy"
        nbytes, sha = store.write_npy(io_utils.join(plan.config.output, rel), arrays[name])
        files[name] = {"path": rel, "bytes": nbytes, "sha256": sha}
    return {"files": files, "query_terms": BM25_QUERY_TERMS}


def load_bm25(root: str, index: dict) -> "retrieval_encoders.BM25Scorer":
    arrays = {name: store.read_npy(io_utils.join(root, store.contained(f["path"])))
              for name, f in index["files"].items()}
    return retrieval_encoders.BM25Scorer.from_arrays(arrays)


def train_index(shard_results: list, embedding_results: list, plan: BuildPlan) -> dict:
    """Train the index on a seeded sample of every vector (ids are global dense ids); write trained.faiss."""
    plan.setup_worker()
    cfg = plan.config
    emb = dict(embedding_results)
    total = sum(r["chunks"] for r in shard_results)
    icfg = retrieval_index.IndexConfig(cfg.index, cfg.nprobe, cfg.train_size, cfg.seed).resolve(total)
    sample_ids = retrieval_index.training_sample(total, icfg.train_size, icfg.seed)
    first = 0
    sample = []
    for r in sorted(shard_results, key=lambda r: r["shard"]):
        lo, hi = np.searchsorted(sample_ids, [first, first + r["chunks"]])
        if hi > lo and r["shard"] in emb:
            vecs = store.read_npy(io_utils.join(cfg.output, emb[r["shard"]]["path"]))
            sample.append(vecs[sample_ids[lo:hi] - first])
        first += r["chunks"]
    dim = retrieval_encoders.MINILM_DIM
    sample_arr = np.concatenate(sample) if sample else np.zeros((0, dim), np.float32)
    index = retrieval_index.train_index(dim, icfg, sample_arr)
    data = retrieval_index.serialize(index)
    rel = f"{plan.generation}/index/trained.faiss"
    io_utils.write_bytes(io_utils.join(cfg.output, rel), data)
    return {"config": icfg.to_dict(), "trained": {"path": rel, "bytes": len(data), "sha256": store.sha256_of(data)},
            "trained_on": int(len(sample_arr))}


def fill_part(element, plan: BuildPlan, trained: dict, shard_results: list):
    """Add one database shard's vectors (with their global ids) to a copy of the trained index; write it."""
    plan.setup_worker()
    k, emb = element
    cfg = plan.config
    first = sum(r["chunks"] for r in shard_results if r["shard"] < k)
    vecs = store.read_npy(io_utils.join(cfg.output, emb["path"]))
    trained_bytes = io_utils.read_bytes(io_utils.join(cfg.output, trained["trained"]["path"]))
    part = retrieval_index.fill_part(trained_bytes, vecs, first)
    data = retrieval_index.serialize(part)
    rel = f"{plan.generation}/index/" + store.shard_name("part", k, cfg.num_db_shards, "faiss")
    io_utils.write_bytes(io_utils.join(cfg.output, rel), data)
    return {"shard": k, "path": rel, "bytes": len(data), "sha256": store.sha256_of(data), "vectors": len(vecs)}


# --------------------------------------------------------------------------------------------- manifest
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


def build_pipeline(p: beam.Pipeline, plan: BuildPlan):
    cfg = plan.config
    read = (p | "ListShards" >> beam.Create(list(plan.shard_paths)) | "SpreadShards" >> beam.Reshuffle()
            | "ReadPieces" >> beam.ParDo(ReadPieces(plan)).with_outputs(READ_TOTALS, main="pieces"))
    pieces = read.pieces
    read_totals = beam.pvalue.AsList(read[READ_TOTALS])
    sources = (p | "ListInputs" >> beam.Create(list(plan.input_paths)) | "SpreadInputs" >> beam.Reshuffle()
               | "ReadSources" >> beam.ParDo(ReadSources(plan)))
    documents = ({"pieces": pieces, "sources": sources} | "JoinByDocument" >> beam.CoGroupByKey()
                 | "Assemble" >> beam.FlatMap(assemble))
    written = (documents
               | "KeyByDbShard" >> beam.Map(lambda d: (retrieval_chunks.db_shard_of(d[0], cfg.num_db_shards), d))
               | "GroupDbShard" >> beam.GroupByKey()
               | "WriteDbShards" >> beam.ParDo(WriteDbShard(plan)))
    results = written | "CollectShards" >> beam.combiners.ToList()
    empties = (results | "EmptyShards" >> beam.FlatMap(empty_shards, cfg.num_db_shards)
               | "WriteEmptyShards" >> beam.ParDo(WriteDbShard(plan)))
    all_results = ((written, empties) | "AllShards" >> beam.Flatten()
                   | "CollectAllShards" >> beam.combiners.ToList())
    if cfg.encoder == retrieval_encoders.BM25:
        bm25 = all_results | "BuildBM25" >> beam.Map(build_bm25, plan)
        return all_results | "Commit" >> beam.Map(commit_db, plan, trained=beam.pvalue.AsSingleton(bm25),
                                                  read_totals=read_totals)
    handler = KeyedModelHandler(MiniLMHandler(cfg.device, cfg.batch_size))
    embeddings = ((written, empties) | "ShardsToEncode" >> beam.Flatten()
                  | "ChunkTexts" >> beam.ParDo(ChunkTexts(plan))
                  | "SpreadTexts" >> beam.Reshuffle()
                  | "Encode" >> RunInference(handler)
                  | "ByShard" >> beam.Map(lambda kv: (kv[0][0], (kv[0][1], kv[1].inference)))
                  | "GroupVectors" >> beam.GroupByKey()
                  | "WriteEmbeddings" >> beam.Map(write_embeddings, plan))
    emb_list = embeddings | "CollectEmbeddings" >> beam.combiners.ToList()
    trained = all_results | "TrainIndex" >> beam.Map(train_index, beam.pvalue.AsSingleton(emb_list), plan)
    parts = (embeddings | "FillIndexParts" >> beam.Map(fill_part, plan, beam.pvalue.AsSingleton(trained),
                                                       beam.pvalue.AsSingleton(all_results))
             | "CollectParts" >> beam.combiners.ToList())
    return all_results | "Commit" >> beam.Map(commit_db, plan, beam.pvalue.AsSingleton(emb_list),
                                              beam.pvalue.AsSingleton(trained), beam.pvalue.AsSingleton(parts),
                                              read_totals=read_totals)


def job_for(config: BuildConfig, beam_args=None) -> "store_job.StoreJob":
    """The build as a job for the job runner (pipeline/job.py): lock, cleanup, commit checks."""
    return store_job.StoreJob(config, beam_args, commit.KIND_RETRIEVAL_DB, "chunk database", store.DB_FORMAT,
                              prepare, build_pipeline)


def run_outcome(config: BuildConfig, beam_args=None) -> job.JobOutcome:
    """Build and commit the chunk database; the outcome pipeline/retrieval/cli.py formats."""
    return job.run_job(job_for(config, beam_args))


def run(config: BuildConfig, beam_args=None) -> dict:
    """Build and commit the chunk database; returns its manifest."""
    return run_outcome(config, beam_args).manifest
