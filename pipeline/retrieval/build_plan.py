"""`pileprep retrieval build`, its plan: the checked dataset manifest, the shards and input files to read, and the
database's generation name (a fingerprint of the dataset, the config, the encoder and the version). The graph is
pipeline/retrieval/build.py.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from pipeline.beam_glue import FilesystemOptions, apply_filesystem_options
from pipeline.config import PILEPREP_VERSION
from pipeline.errors import ConfigError
from pipeline.ops import commit
from pipeline.retrieval import store
from pipeline.retrieval.config import BuildConfig
from transforms.io import io_utils
from transforms.retrieval import retrieval_encoders
from transforms.tokenize import tokenizer


@dataclasses.dataclass(frozen=True)
class BuildPlan:
    config: BuildConfig
    dataset_manifest: dict[str, Any]  # the dataset's manifest JSON (model_contract/manifest.py Manifest.to_dict)
    shard_paths: tuple[str, ...]  # absolute paths of the shards of the chosen splits
    input_paths: tuple[str, ...]  # the dataset's input files (for sources)
    generation: str
    fingerprint: str
    encoder: dict[str, Any]  # the `encoder` JSON (transforms/retrieval/retrieval_encoders.py EncoderInfo.to_dict)
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
