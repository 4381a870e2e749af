"""The shard job: inputs → chunks → tokenized units → packed TFRecord shards → manifest (written last).

Wiring only; the work is in transforms/stages.py. Bulk data moves through files in the staging directory,
elements are small descriptors, and every name and order is derived from the input and config, so the
output is byte-identical whatever the runner or the number of workers.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from model_contract import DataContract
from pipeline import commit
from pipeline.config import PILEPREP_VERSION, ConfigError, ShardConfig, fingerprint
from pipeline.manifest_builder import build_manifest, plan_shard_tasks
from transforms import io_utils, tokenizer, stages

LOG = logging.getLogger("pileprep.shard")
DEFAULT_BEAM_ARGS = ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]


@dataclass(frozen=True)
class JobPlan:
    """Everything decided on the driver before the pipeline starts."""
    config: ShardConfig
    ledger: list  # [(path, size)] sorted by path
    model_bytes: bytes
    contract: DataContract
    generation: str
    data_dir: str
    staging_dir: str


def resolve_inputs(globs) -> list:
    """Expand globs to a sorted (path, size) ledger; a glob that matches nothing is a config error."""
    found = {}
    for pattern in globs:
        try:
            metadata = FileSystems.match([pattern])[0].metadata_list
        except Exception as e:  # noqa: BLE001 - Beam raises BeamIOError with nested causes
            raise ConfigError(f"--input {pattern}: cannot list it ({e})") from None
        files = [m for m in metadata if not m.path.endswith("/")]
        if not files:
            raise ConfigError(f"--input {pattern}: no such file (nothing matches)")
        for m in files:
            found[m.path] = m.size_in_bytes
    return sorted(found.items())


def prepare(config: ShardConfig) -> JobPlan:
    """Validate the config, list inputs and load the tokenizer: all failures happen here, before any work."""
    config.validate()
    ledger = resolve_inputs(config.inputs)
    model_bytes = tokenizer.read_model_bytes(config.tokenizer)
    sp = tokenizer.load_processor(model_bytes, config.tokenizer)
    contract = DataContract.for_tokens(config.seq_len, tokenizer.describe(sp, model_bytes))
    generation = "gen-" + fingerprint(config, contract.tokenizer.model_sha256, ledger)
    staging_root = config.staging_dir or io_utils.join(config.output, "_staging")
    return JobPlan(config, ledger, model_bytes, contract, generation, io_utils.join(config.output, generation),
                   io_utils.join(staging_root, generation))


class SplitInputFile(beam.DoFn):
    def __init__(self, plan: JobPlan):
        self.plan = plan
        self.records = Metrics.counter("pileprep", "input_files")

    def process(self, element):
        file_idx, path = element
        cfg = self.plan.config
        result = stages.split_input_file(file_idx, path, self.plan.staging_dir, self.plan.data_dir,
                                         cfg.unit_bytes, cfg.max_line_bytes)
        self.records.inc()
        yield result


class TokenizeChunk(beam.DoFn):
    """Loads the SentencePiece model once per worker (setup), then tokenizes whole chunks."""

    def __init__(self, plan: JobPlan):
        self.plan = plan
        self.documents = Metrics.counter("pileprep", "documents")
        self.tokens = Metrics.counter("pileprep", "tokens")
        self.records = Metrics.counter("pileprep", "records")
        self.raw_bytes = Metrics.counter("pileprep", "raw_bytes")

    def setup(self):
        self.sp = tokenizer.load_processor(self.plan.model_bytes, self.plan.config.tokenizer)
        self.dtype = tokenizer.token_dtype(self.plan.contract.tokenizer.vocab_size)
        cfg = self.plan.config
        self.settings = stages.TokenizeSettings(cfg.text_field, tuple(cfg.source_fields), cfg.val_fraction,
                                                cfg.test_fraction, cfg.seed)

    def process(self, chunk):
        unit = stages.tokenize_chunk(chunk, self.sp, self.dtype, self.settings, self.plan.staging_dir,
                                     self.plan.data_dir)
        self.documents.inc(unit.n_docs)
        self.tokens.inc(sum(unit.split_tokens))
        self.records.inc(unit.stats["read"])
        self.raw_bytes.inc(chunk.raw_bytes)
        yield unit


class PackShard(beam.DoFn):
    def __init__(self, plan: JobPlan):
        self.plan = plan
        self.examples = Metrics.counter("pileprep", "examples")

    def process(self, task, units):
        t = self.plan.contract.tokenizer
        result = stages.pack_shard(task, units, self.plan.config.seq_len, t.eos_id, t.pad_id, self.plan.data_dir)
        self.examples.inc(result.examples)
        yield result


def _sorted_units(units):
    return sorted(units, key=lambda u: u.name)


def _commit(shard_results, plan: JobPlan, split_results, unit_results):
    manifest = build_manifest(plan.config, plan.contract, plan.ledger, plan.generation, plan.config.output,
                              split_results, _sorted_units(unit_results), shard_results)
    commit.publish_manifest(plan.config.output, manifest.to_json())
    io_utils.delete_tree(plan.staging_dir)
    return manifest.to_dict()


def build_pipeline(p: beam.Pipeline, plan: JobPlan):
    """Attach the shard job to a pipeline; returns the PCollection holding the committed manifest dict."""
    files = (p
             | "ListInputs" >> beam.Create([(i, path) for i, (path, _size) in enumerate(plan.ledger)])
             | "SpreadFiles" >> beam.Reshuffle())
    splits = files | "SplitIntoChunks" >> beam.ParDo(SplitInputFile(plan))
    units = (splits
             | "Chunks" >> beam.FlatMap(lambda r: r.chunks)
             | "SpreadChunks" >> beam.Reshuffle()
             | "Tokenize" >> beam.ParDo(TokenizeChunk(plan)))
    unit_list = units | "CollectUnits" >> beam.combiners.ToList() | "SortUnits" >> beam.Map(_sorted_units)
    shards = (unit_list
              | "PlanShards" >> beam.FlatMap(plan_shard_tasks, plan.config)
              | "SpreadShards" >> beam.Reshuffle()
              | "PackShards" >> beam.ParDo(PackShard(plan), units=beam.pvalue.AsSingleton(unit_list)))
    split_list = splits | "CollectSplits" >> beam.combiners.ToList()
    return (shards
            | "CollectShards" >> beam.combiners.ToList()
            | "CommitManifest" >> beam.Map(_commit, plan, split_results=beam.pvalue.AsSingleton(split_list),
                                           unit_results=beam.pvalue.AsSingleton(unit_list)))


def pipeline_options(beam_args) -> PipelineOptions:
    args = list(beam_args or [])
    if not any(a.startswith("--runner") for a in args):
        args = DEFAULT_BEAM_ARGS + args
    return PipelineOptions(args)


def run(config: ShardConfig, beam_args=None) -> dict:
    """Run the shard job to completion and return the committed manifest as a dict."""
    plan = prepare(config)
    committed = commit.read_committed(config.output)
    if committed is not None and committed.extra.get("generation") == plan.generation:
        LOG.info("%s already holds generation %s: nothing to do", config.output, plan.generation)
        return committed.to_dict()
    started = time.time()
    with beam.Pipeline(options=pipeline_options(beam_args)) as p:
        build_pipeline(p, plan)
    LOG.info("shard job finished in %.1fs (pileprep %s)", time.time() - started, PILEPREP_VERSION)
    committed = commit.read_committed(config.output)
    if committed is None or committed.extra.get("generation") != plan.generation:
        raise RuntimeError("the pipeline finished but did not commit a manifest")
    return committed.to_dict()
