"""Configuration of the retrieval jobs: one typed place each, validated before any work (exit 2, one line)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pipeline.errors import ConfigError
from pipeline.ops.guards import normal_path
from transforms.retrieval.retrieval_encoders import ENCODERS
from transforms.retrieval.retrieval_index import validate_spec


def output_overlap(output: str, **inputs: str) -> list:
    """Problems for an --output that is, contains or lies inside an input (--dataset, --db): a sidecar written
    into a dataset's generation directory changes a committed dataset (review33)."""
    out = normal_path(output)
    problems = []
    for flag, path in inputs.items():
        src = normal_path(path)
        if out == src or out.startswith(src.rstrip("/") + "/") or src.startswith(out.rstrip("/") + "/"):
            problems.append(f"--output {output} overlaps --{flag} {path}: write the output outside every input")
    return problems


@dataclass(frozen=True)
class BuildConfig:
    dataset: str  # committed shard dataset (directory with manifest.json)
    output: str  # chunk database directory
    chunk_len: int = 64
    splits: tuple[str, ...] = ("train",)  # which splits of the dataset go into the database
    encoder: str = "bm25"
    index: str = "auto"  # Faiss index_factory spec for dense encoders
    nprobe: int = 64
    train_size: int = 100_000
    seed: int = 0
    num_db_shards: int = 4
    doc_fraction: float = 1.0  # keep documents whose id falls in the first fraction of the id space
    device: str = "cpu"  # dense encoder device (cuda on GPU workers)
    batch_size: int = 64  # dense encoder batch
    sources: bool = True  # join each document's source from the dataset's input files
    rerank: int = 0  # candidates re-ranked exactly from the fp16 embeddings (0: the index's default, see resolve)

    def validate(self) -> None:
        problems = []
        if self.chunk_len < 1:
            problems.append(f"--chunk-len must be positive, got {self.chunk_len}")
        if self.encoder not in ENCODERS:
            problems.append(f"--encoder must be one of {', '.join(ENCODERS)}, got {self.encoder!r}")
        spec_problem = validate_spec(self.index)
        if spec_problem:
            problems.append(f"--index: {spec_problem}")
        if self.num_db_shards < 1:
            problems.append(f"--num-db-shards must be at least 1, got {self.num_db_shards}")
        if not 0.0 < self.doc_fraction <= 1.0:
            problems.append(f"--doc-fraction must be in (0, 1], got {self.doc_fraction}")
        if self.rerank < 0:
            problems.append(f"--rerank must be 0 (the index's default) or positive, got {self.rerank}")
        if self.batch_size < 1 or self.nprobe < 1:
            problems.append("--batch-size and --nprobe must be positive")
        problems += output_overlap(self.output, dataset=self.dataset)
        bad = [s for s in self.splits if s not in ("train", "val", "test")]
        if bad:
            problems.append(f"--splits: unknown split(s) {bad}")
        if problems:
            raise ConfigError("invalid retrieval build configuration:\n  " + "\n  ".join(problems))

    def identity(self) -> dict:
        """What shapes the database (not where or how it ran)."""
        return {"chunk_len": self.chunk_len, "splits": list(self.splits), "encoder": self.encoder,
                "index": self.index, "nprobe": self.nprobe, "train_size": self.train_size, "seed": self.seed,
                "num_db_shards": self.num_db_shards, "doc_fraction": self.doc_fraction, "sources": self.sources,
                **({"rerank": self.rerank} if self.rerank else {}),  # absent when 0: older fingerprints hold
                # a dense encoder's vectors depend on its batch (padding) and device (kernels): not BM25's
                **({"encode": {"batch_size": self.batch_size, "device": self.device}}
                   if self.encoder != "bm25" else {})}


@dataclass(frozen=True)
class NeighboursConfig:
    dataset: str  # committed shard dataset
    db: str  # committed chunk database
    output: str  # sidecar directory
    num_neighbours: int = 2
    neighbour_len: int = 128
    batch_size: int = 64
    device: str = "cpu"
    nprobe: Optional[int] = None  # default: the database's
    # > 0: the IVF index searched in this many ranges of inverted lists through the runner's GroupByKey
    # (pipeline/retrieval/neighbours_sharded.py); the sidecar does not depend on the number. 0: one worker per
    # dataset shard holds the whole index (pipeline/retrieval/neighbours.py)
    ranges: int = 0

    def encode_identity(self) -> dict:
        """What shapes the query vectors besides the model: the batch they are padded in and the device."""
        return {"batch_size": self.batch_size, "device": self.device}

    def validate(self, chunk_len: Optional[int] = None) -> None:
        problems = []
        if self.num_neighbours < 1:
            problems.append(f"--num-neighbours must be positive, got {self.num_neighbours}")
        if self.neighbour_len < 1:
            problems.append(f"--neighbour-len must be positive, got {self.neighbour_len}")
        if chunk_len is not None and self.neighbour_len < chunk_len:
            problems.append(f"--neighbour-len {self.neighbour_len} is shorter than the database's chunk_len "
                            f"{chunk_len} (RETRO uses chunk + continuation = 2 x chunk_len)")
        problems += output_overlap(self.output, dataset=self.dataset, db=self.db)
        if self.ranges < 0:
            problems.append(f"--ranges must be 0 (no range search) or positive, got {self.ranges}")
        if problems:
            raise ConfigError("invalid retrieval neighbours configuration:\n  " + "\n  ".join(problems))
