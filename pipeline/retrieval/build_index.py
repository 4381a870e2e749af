"""`pileprep retrieval build`, its index stages: each database shard's chunk texts → MiniLM vectors (a model
handler, called per batch in the worker that reads the shard) → its embedding file → a trained Faiss index and one filled part per database shard; or, for the BM25 encoder, the
postings as .npy files. The encoders are transforms/retrieval/retrieval_encoders.py, the index
transforms/retrieval/retrieval_index.py.
"""
from __future__ import annotations

import re

import numpy as np
from apache_beam.ml.inference.base import ModelHandler

from model_contract.contract import TokenizerInfo
from pipeline.beam_glue import PlanDoFn
from pipeline.errors import ConfigError
from pipeline.retrieval import store
from pipeline.retrieval.build_plan import BuildPlan
from transforms.io import io_utils
from transforms.retrieval import retrieval_encoders, retrieval_index
from transforms.tokenize import tokenizer


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
    """A written database shard's chunks, decoded to text with the dataset's own tokenizer (for the encoder)."""

    def setup(self):
        super().setup()
        # the dataset's own tokenizer options (a tiktoken file's pattern and specials live in the contract)
        info = TokenizerInfo.from_dict(self.plan.dataset_manifest["contract"]["tokenizer"])
        self.sp = tokenizer.load_for_info(self.plan.model_bytes, info)

    def texts(self, rows) -> list:
        return [self.sp.decode([int(t) for t in toks]) for toks in rows]


class EncodeShard(ChunkTexts):
    """A written database shard → its embeddings file, encoded and written in the worker that reads the shard:
    (shard, {"path", "bytes", "sha256", "rows"}). Batches of `batch_size` chunks in row order, so the bytes do not
    depend on the runner's bundles. Before, every vector went through a GroupByKey by shard (RunInference, then
    `GroupVectors`) and the worker's peak grew with the number of database shards (docs/RETRIEVAL.md "Not done /
    limits"; likely FnApiRunner encoding all of a grouping's keys for one worker into one stream,
    apache_beam/runners/portability/fn_api_runner/execution.py GroupingBuffer.partition)."""

    def __init__(self, plan: BuildPlan, handler: ModelHandler):
        super().__init__(plan)
        self.handler = handler

    def setup(self):
        super().setup()
        self.model = self.handler.load_model()

    def process(self, result):
        cfg = self.plan.config
        k = result["shard"]
        rows = store.read_parquet(io_utils.join(cfg.output, result["path"]), ["tokens"])["tokens"]
        # fp16 on disk (issue 33): what re-ranking reads by row (retrieval_rerank.FileRows) and what the index is
        # trained and filled from, half the bytes of float32; compared by recall, not bytes (docs/RETRIEVAL.md,
        # `--fp16-db`). Assigning float32 into it rounds as astype(np.float16) does.
        vecs = np.zeros((len(rows), retrieval_encoders.MINILM_DIM), np.float16)
        for lo in range(0, len(rows), cfg.batch_size):
            found = self.handler.run_inference(self.texts(rows[lo:lo + cfg.batch_size]), self.model)
            vecs[lo:lo + len(found)] = np.stack([r.inference for r in found])
        rel = f"{self.plan.generation}/" + store.shard_name("embeddings", k, cfg.num_db_shards, "npy")
        nbytes, sha = store.write_npy(io_utils.join(cfg.output, rel), vecs)
        yield k, {"path": rel, "bytes": nbytes, "sha256": sha, "rows": len(vecs)}


BM25_ARRAYS = ("vocab", "data", "indices", "indptr", "num_chunks")
BM25_QUERY_TERMS = 8


def build_bm25(shard_results: list, plan: BuildPlan) -> dict:
    """The BM25 postings over every chunk, in database order, as plain .npy files (deterministic bytes)."""
    plan.setup_worker()
    tokens = []
    for r in sorted(shard_results, key=lambda r: r["shard"]):
        tokens += store.read_parquet(io_utils.join(plan.config.output, r["path"]), ["tokens"])["tokens"]
    if not tokens:  # bm25s fails on an empty corpus with `max() arg is an empty sequence`
        raise ConfigError("retrieval build: the database holds no chunks (no document of --splits kept by "
                          "--doc-fraction); widen either")
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
    icfg = retrieval_index.IndexConfig(cfg.index, cfg.nprobe, cfg.train_size, cfg.seed, cfg.rerank).resolve(total)
    sample_ids = retrieval_index.training_sample(total, icfg.train_size, icfg.seed)
    first = 0
    sample = []
    for r in sorted(shard_results, key=lambda r: r["shard"]):
        lo, hi = np.searchsorted(sample_ids, [first, first + r["chunks"]])
        if hi > lo and r["shard"] in emb:
            vecs = store.read_npy(io_utils.join(cfg.output, emb[r["shard"]]["path"]))
            sample.append(vecs[sample_ids[lo:hi] - first].astype(np.float32))
        first += r["chunks"]
    dim = retrieval_encoders.MINILM_DIM
    sample_arr = np.concatenate(sample) if sample else np.zeros((0, dim), np.float32)
    try:
        index = retrieval_index.train_index(dim, icfg, sample_arr)
    except RuntimeError as e:  # Faiss's k-means: fewer points than clusters (IVF lists, or 2^bits PQ codes)
        found = re.search(r"Number of training points \((\d+)\).*clusters \((\d+)\)", str(e))
        if not found:
            raise
        raise ConfigError(f"--index {icfg.spec}: its k-means needs at least {found.group(2)} training vectors, "
                          f"got {found.group(1)} vectors (the database's, at most --train-size); use fewer lists "
                          "or PQ bits, a larger --train-size, or --index auto") from None
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
    vecs = store.read_npy(io_utils.join(cfg.output, emb["path"])).astype(np.float32)  # fp16 on disk
    trained_bytes = io_utils.read_bytes(io_utils.join(cfg.output, trained["trained"]["path"]))
    part = retrieval_index.fill_part(trained_bytes, vecs, first)
    data = retrieval_index.serialize(part)
    rel = f"{plan.generation}/index/" + store.shard_name("part", k, cfg.num_db_shards, "faiss")
    io_utils.write_bytes(io_utils.join(cfg.output, rel), data)
    return {"shard": k, "path": rel, "bytes": len(data), "sha256": store.sha256_of(data), "vectors": len(vecs)}
