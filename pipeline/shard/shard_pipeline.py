"""The shard job: inputs → chunks → tokenized units → packed TFRecord shards → manifest (written last).

Wiring only; the work is in transforms/shard/stages.py. Bulk data moves through files in the staging directory,
elements are small descriptors, and every name and order is derived from the input and config, so the
output is byte-identical whatever the runner or the number of workers.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import logging
import os
import pickle
import re
import signal
import threading
import time
from dataclasses import dataclass
from typing import Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from model_contract import DataContract
from pipeline.ops import commit, guards, incremental, lock, progress, runlog, runners, storage
from pipeline.config import PILEPREP_VERSION, ShardConfig, fingerprint
from pipeline.errors import RunError, RunInterrupted
from pipeline.shard import cancel, integrity, runner_shuffle, source_check, split_inputs
from pipeline.shard.manifest_builder import build_manifest, plan_shard_tasks
from transforms.shard import corpus_stats, stages
from transforms.io import io_utils, memory
from transforms.tokenize import tokenizer, tokenizer_backends

LOG = logging.getLogger("pileprep.shard")


def default_beam_args(cores: Optional[int] = None) -> list:
    """The local runner when no --runner is given: FnApiRunner, one worker per core.

    Up to 4 cores the workers are threads of this process (multi_threading): tokenizers run in native code
    without the GIL (SentencePiece scales 1.85x on 2 threads, measured), and the run skips starting worker
    processes that each import Beam (on 2 cores at 96 MB: ~1.2 s of wall and ~5 CPU-s, measured). Above that the
    GIL-held share (JSON parsing, packing, ~15% of CPU) would cap the scaling, so workers are processes.
    Output bytes do not depend on this choice (tests/e2e/test_shard_pipeline.py runs both).
    """
    cores = cores or len(os.sched_getaffinity(0))
    mode = "multi_threading" if cores <= 4 else "multi_processing"
    return ["--runner=FnApiRunner", f"--direct_num_workers={cores}", f"--direct_running_mode={mode}"]


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
    # Ops (pipeline/ops/incremental.py, pipeline/ops/commit.py): the ledger rows {path, bytes, mtime[, etag]} of the
    # files this generation ingests, the committed manifest the run started from, and whether to add to it.
    input_rows: tuple = ()
    previous_json: Optional[str] = None
    incremental: bool = False
    nothing_to_do: bool = False
    filesystem_options: Optional["FilesystemOptions"] = None
    # Splits and dedup (pipeline/shard/split_inputs.py, transforms/shard/doc_ids.py): per ledger file its split
    # (HASHED for train inputs), and the id indexes of the committed generations new documents are checked against.
    input_splits: tuple = ()
    committed_id_indexes: tuple = ()
    tokenizer_backend: Optional["tokenizer_backends.BackendChoice"] = None
    skipped_inputs: tuple = ()  # glob matches that are not files (directories, dangling symlinks)
    # Once the run starts, the model travels as a staged file (stage_model): every DoFn and Map that holds the
    # plan is pickled (bz2, level 9) into the job graph, and a 0.5 MB model in each cost ~0.5 s of start-up
    # and megabytes of graph (Dataflow caps a job's graph at 10 MB).
    model_path: Optional[str] = None

    def tokenizer_model(self) -> bytes:
        """The model bytes: from the plan, or from the staged copy, checked against the contract's sha256."""
        if self.model_bytes or self.model_path is None:
            return self.model_bytes
        data = io_utils.read_bytes(self.model_path)
        if hashlib.sha256(data).hexdigest() != self.contract.tokenizer.model_sha256:
            raise RunError(f"{self.model_path}: the staged tokenizer model does not match the plan's sha256; "
                           "another process wrote to this run's staging directory")
        return data

    def setup_worker(self) -> None:
        """What every DoFn of the job does in setup(): the job's S3 settings, and the malloc threshold pin."""
        _apply_filesystem_options(self)
        memory.pin_mmap_threshold()

    @property
    def previous(self):
        from model_contract import Manifest  # noqa: PLC0415

        return None if self.previous_json is None else Manifest.from_json(self.previous_json)

    @property
    def input_bytes(self) -> int:
        return sum(size for _path, size in self.ledger)


class FilesystemOptions:
    """The job's filesystem options (s3_*), re-applied on workers.

    FnApiRunner's worker processes and some worker pools start without the job's pipeline options, so Beam's
    S3 filesystem there would ignore `--s3_endpoint_url` & co. The plan carries them and every DoFn applies
    them in setup(). The repr hides the values (credentials may be among them).
    """

    def __init__(self, options: dict):
        self.options = dict(options)

    def __repr__(self):
        return f"FilesystemOptions({sorted(self.options)})"

    @classmethod
    def from_pipeline_options(cls, options: PipelineOptions) -> Optional["FilesystemOptions"]:
        d = options.get_all_options(drop_default=True)
        picked = {k: v for k, v in d.items() if k.startswith("s3_") and v is not None}
        return cls(picked) if picked else None

    def apply(self) -> None:
        current = FileSystems._pipeline_options  # noqa: SLF001 - Beam keeps the worker's options here
        d = current.get_all_options(drop_default=True) if current is not None else {}
        if all(d.get(k) == v for k, v in self.options.items()):
            return
        d.update(self.options)
        FileSystems.set_options(PipelineOptions.from_dictionary(d))


def _apply_filesystem_options(plan: "JobPlan") -> None:
    if plan.filesystem_options is not None:
        plan.filesystem_options.apply()


def prepare(config: ShardConfig, incremental_run: bool = False) -> JobPlan:
    """Validate the config, list inputs and load the tokenizer: all failures happen here, before any work.

    With `incremental_run`, only input files the committed dataset does not hold yet are planned (changed or
    removed ones are an error, see pipeline/ops/incremental.py); `nothing_to_do` says there are none.
    """
    config.validate()
    commit.check_staging_dir(config.output, config.staging_dir)
    rows, split_of_path = split_inputs.list_inputs_with_splits(config)
    for warning in split_inputs.held_out_name_warnings(split_of_path):
        LOG.warning("%s", warning)
    skipped = guards.skipped_inputs(tuple(config.inputs) + tuple(config.val_inputs) + tuple(config.test_inputs))
    model_bytes = tokenizer.read_model_bytes(config.tokenizer)
    sp = tokenizer.load_processor(model_bytes, config.tokenizer)
    contract = DataContract.for_tokens(config.seq_len, tokenizer.describe(sp, model_bytes))
    previous = commit.read_committed(config.output)
    if incremental_run and previous is not None:
        incremental.check_compatible(previous, contract.to_dict(), config.to_manifest_dict())
        diff = incremental.diff_ledger(incremental.ledger_of(previous), rows)
        LOG.info("--incremental over %s: %s", config.output, diff.summary())
        for row in diff.touched:
            LOG.info("%s: mtime/ETag changed but the bytes did not (sha256 matches); not re-ingested", row["path"])
        incremental.raise_for_changes(diff, config.output)
        rows = diff.new
    if rows:  # a --text-field that no record has would dead-letter everything: say so before any work
        guards.sample_text_field([r["path"] for r in rows], config.text_field, config.max_line_bytes)
        source_check.check_source_weights(config, [r["path"] for r in rows])  # a named source must exist
    elif previous is not None:  # "nothing to do" only over a dataset whose files are all there
        damaged = guards.damaged_files(config.output, previous)
        if damaged:
            raise RunError(f"{config.output}: the committed dataset is damaged ({len(damaged)} file(s): "
                           f"{'; '.join(damaged[:3])}); rebuild it without --incremental")
    ledger = [(r["path"], r["bytes"]) for r in rows]
    live = incremental.referenced_generations(previous)
    incremental_plan = incremental_run and previous is not None
    generation = "gen-" + fingerprint(config, contract.tokenizer.model_sha256, ledger,
                                      parents=live if incremental_plan else ())
    if not incremental_plan and generation in live and (live != {generation} or guards.damaged_files(
            config.output, previous)):
        # A full build whose name a committed, multi-generation (or damaged) dataset already uses: never write
        # into a live generation's directory (a reader or a crash would see it half-written); take a new name.
        generation = "gen-" + fingerprint(config, contract.tokenizer.model_sha256, ledger, parents=live)
    staging_root = config.staging_dir or io_utils.join(config.output, "_staging")
    backend = tokenizer_backends.choose_backend(config.tokenizer_backend, model_bytes, sp,
                                                _parity_sample(config, [path for path, _size in ledger]))
    return JobPlan(config, ledger, model_bytes, contract, generation, io_utils.join(config.output, generation),
                   io_utils.join(staging_root, generation), input_rows=tuple(rows),
                   previous_json=None if previous is None else previous.to_json(),
                   incremental=incremental_plan, nothing_to_do=not rows, tokenizer_backend=backend,
                   input_splits=split_inputs.input_splits_for(ledger, split_of_path),
                   committed_id_indexes=integrity.committed_id_indexes(previous, config.output)
                   if incremental_plan else (),
                   skipped_inputs=tuple(skipped))


MODEL_FILE_NAME = "tokenizer.model"


def stage_model(plan: JobPlan) -> JobPlan:
    """Write the tokenizer model into the run's staging directory; the returned plan carries its path only."""
    path = io_utils.join(plan.staging_dir, MODEL_FILE_NAME)
    io_utils.write_bytes(path, plan.model_bytes)
    return dataclasses.replace(plan, model_bytes=b"", model_path=path)


def _parity_sample(config: ShardConfig, paths: list) -> list:
    """About 1 MB of the run's own documents (seeded choice of files), read and parsed as the job does."""
    from transforms.shard.documents import Document, parse_record  # noqa: PLC0415
    from transforms.io.read_records import RawRecord, compression_of, iter_raw_records  # noqa: PLC0415

    def read(path):
        with io_utils.open_read(path) as f:
            for rec in iter_raw_records(f, compression_of(path), config.max_line_bytes, config.max_zstd_window_bytes):
                if isinstance(rec, RawRecord):
                    yield rec.line, rec.data

    def parse(data):
        doc = parse_record(data, config.text_field, tuple(config.source_fields))
        # texts above FAST_BACKEND_MAX_CHARS are always encoded by SentencePiece itself: no parity to check
        return doc.text if isinstance(doc, Document) and len(doc.text) <= tokenizer.FAST_BACKEND_MAX_CHARS else None

    if config.tokenizer_backend == "sentencepiece":
        return []
    return tokenizer_backends.sample_documents(paths, config.text_field, config.seed, read=read, parse=parse)


@dataclass(frozen=True)
class SplitOutput:
    """What the split stage hands on for one input file: its chunks and the digest row for the ledger.

    One element type on one output: some runners (Beam's DaskRunner) mix a multi-output ParDo's outputs into
    one collection, so the digest travels inside the main output instead of on a tagged one.
    """
    result: "stages.SplitResult"
    digest: tuple  # (path, bytes, sha256)


class SplitInputFile(beam.DoFn):
    """Cuts one input file into line-aligned chunks in staging; yields a SplitOutput."""

    def __init__(self, plan: JobPlan):
        self.plan = plan
        self.records = Metrics.counter("pileprep", "input_files")
        self.input_bytes = Metrics.counter("pileprep", "input_bytes")

    def setup(self):
        self.plan.setup_worker()

    def process(self, element):
        # Every write of the call, its progress marker included, happens inside cancel.call: once the driver
        # has cancelled the run and seen no call running, nothing writes into the staging it removes.
        output = cancel.call(self._split, *element)
        if output is not None:  # None: the driver cancelled the run (pipeline/shard/cancel.py)
            yield output

    def _split(self, file_idx: int, path: str) -> SplitOutput:
        cfg = self.plan.config
        result = stages.split_input_file(file_idx, path, self.plan.staging_dir, self.plan.data_dir,
                                         cfg.unit_bytes, cfg.max_line_bytes, cfg.max_zstd_window_bytes,
                                         (cfg.text_field, *cfg.source_fields), cancel.check)
        size, sha = incremental.file_sha256(path)
        self.records.inc()
        self.input_bytes.inc(size)
        progress.write_marker(self.plan.staging_dir, f"split-f{file_idx:06d}", {
            "input_files": 1, "input_bytes": size, "split_raw_bytes": sum(c.raw_bytes for c in result.chunks)})
        return SplitOutput(result, (path, size, sha))


class TokenizeChunk(beam.DoFn):
    """Loads the SentencePiece model once per worker (setup), then tokenizes whole chunks."""

    def __init__(self, plan: JobPlan):
        self.plan = plan
        self.documents = Metrics.counter("pileprep", "documents")
        self.tokens = Metrics.counter("pileprep", "tokens")
        self.records = Metrics.counter("pileprep", "records")
        self.raw_bytes = Metrics.counter("pileprep", "raw_bytes")

    def setup(self):
        self.plan.setup_worker()
        model_bytes = self.plan.tokenizer_model()
        sp = tokenizer.load_processor(model_bytes, self.plan.config.tokenizer)
        self.sp = sp if self.plan.tokenizer_backend is None else tokenizer_backends.make_encoder(
            self.plan.tokenizer_backend, model_bytes, sp)
        self.dtype = tokenizer.token_dtype(self.plan.contract.tokenizer.vocab_size)
        self.byte_mask = corpus_stats.byte_piece_mask(self.sp)
        cfg = self.plan.config
        self.settings = stages.TokenizeSettings(cfg.text_field, tuple(cfg.source_fields), cfg.val_fraction,
                                                cfg.test_fraction, cfg.seed, self.plan.input_splits)

    def process(self, chunk):
        unit = cancel.call(self._tokenize, chunk)
        if unit is not None:
            yield unit

    def _tokenize(self, chunk) -> "stages.UnitResult":
        unit = stages.tokenize_chunk(chunk, self.sp, self.dtype, self.settings, self.plan.staging_dir,
                                     self.plan.data_dir, self.byte_mask, cancel.check)
        self.documents.inc(unit.n_docs)
        self.tokens.inc(sum(unit.split_tokens))
        self.records.inc(unit.stats["read"])
        self.raw_bytes.inc(chunk.raw_bytes)
        progress.write_marker(self.plan.staging_dir, "unit-" + unit.name, {
            "documents": unit.n_docs, "tokens": sum(unit.split_tokens), "records": unit.stats["read"],
            "raw_bytes": chunk.raw_bytes, "dead_letters": sum(unit.stats["dead_lettered"].values())})
        return unit


class PackShard(beam.DoFn):
    def __init__(self, plan: JobPlan):
        self.plan = plan
        self.examples = Metrics.counter("pileprep", "examples")

    def setup(self):
        self.plan.setup_worker()

    def _units(self, path: str) -> list:
        if getattr(self, "_units_path", None) != path:
            self._units_list = pickle.loads(io_utils.read_bytes(path))
            self._units_path = path
        return self._units_list

    def process(self, task_and_units_path):
        task, units_path, dedup = task_and_units_path
        units = self._units(units_path)
        t = self.plan.contract.tokenizer
        cfg = self.plan.config
        result = cancel.call(stages.pack_shard, task, units, cfg.seq_len, t.eos_id, t.pad_id, self.plan.data_dir,
                             dedup, self.plan.staging_dir, cfg.mixture_weights, cfg.seed)
        if result is None:
            return
        self.examples.inc(result.examples)
        yield result


def _sorted_units(units):
    return sorted(units, key=lambda u: u.name)


def _index_doc_ids(shard_results, plan: JobPlan) -> tuple:
    id_index = stages.write_generation_id_index(shard_results, plan.data_dir)
    io_utils.fsync_files([id_index[0]])  # durable before the manifest that references it (pipeline/ops/commit.py)
    return id_index


def _commit(grouped, plan: JobPlan):
    """The commit point: one element holding every stage's results, tagged by kind (see GatherForCommit)."""
    _apply_filesystem_options(plan)
    parts = {"split": [], "unit": [], "shard": []}
    for kind, value in grouped:
        parts[kind].append(value)
    split_outputs = sorted(parts["split"], key=lambda s: s.result.file_idx)
    split_results = [s.result for s in split_outputs]
    digests = [s.digest for s in split_outputs]
    manifest = build_manifest(plan.config, plan.contract, plan.ledger, plan.generation, plan.config.output,
                              split_results, _sorted_units(parts["unit"]), parts["shard"])
    guards.check_dead_letter_rate(manifest.records, plan.config.max_dead_letter_fraction)
    manifest = integrity.add_integrity_sections(manifest, plan.config.output, plan.generation, parts["shard"],
                                                _index_doc_ids(parts["shard"], plan))
    manifest = incremental.add_ledger(manifest, plan.generation, list(plan.input_rows),
                                      {path: (size, sha) for path, size, sha in digests})
    manifest.skipped_inputs = [dict(r) for r in plan.skipped_inputs]
    previous = plan.previous
    if plan.incremental:
        manifest = incremental.merge(previous, manifest)
    if plan.tokenizer_backend is not None:  # how this generation was tokenized; the only backend-dependent field
        manifest.extra["tokenizer_backend"] = plan.tokenizer_backend.to_manifest()
    commit.commit_dataset(plan.config.output, manifest,
                          None if previous is None else previous.generation, plan.staging_dir,
                          previous)
    return manifest.to_dict()


class Spread(beam.PTransform):
    """Redistribute elements over workers by a deterministic key: a GroupByKey every runner implements.

    Beam's Reshuffle is a no-op on some runners (DaskRunner keeps every element in the partition that made it,
    so all chunks of one file would tokenize in one task); grouping by a key spreads them on all of them. The
    key only decides placement: element order never reaches the output, which is sorted by name downstream.
    """

    def __init__(self, key_fn):
        super().__init__()
        self.key_fn = key_fn

    def expand(self, pcoll):
        return (pcoll
                | "Key" >> beam.Map(lambda x, key_fn: (key_fn(x), x), self.key_fn)
                | "Group" >> beam.GroupByKey()
                | "Values" >> beam.FlatMap(lambda kv: kv[1]))


class GatherAll(beam.PTransform):
    """All elements of a PCollection as one list, in one element, through a GroupByKey on a single key.

    Used instead of side inputs: runners that build a side input by recomputing its producer inside the
    consuming task (DaskRunner) would rerun a whole stage per consumer; a main-input join runs it once.
    """

    def expand(self, pcoll):
        return (pcoll
                | "OneKey" >> beam.Map(lambda x: (0, x))
                | "Group" >> beam.GroupByKey()
                | "List" >> beam.Map(lambda kv: list(kv[1])))


def _tagged(kind: str):
    return beam.Map(lambda x, kind: (kind, x), kind)


UNIT_LIST_NAME = "units.pickle"


def _plan_shards(units, plan: "JobPlan"):
    """Plan the shards and stage the sorted unit list once; each pack task carries only its path.

    Carrying the list in every task would move units × shards descriptors through the shuffle; a side input
    would be rebuilt per consumer on some runners. One staged file, read once per worker, does neither.
    """
    units, tasks, dedup = _shard_plan(units, plan)
    path = io_utils.join(plan.staging_dir, UNIT_LIST_NAME)
    io_utils.write_bytes(path, pickle.dumps(units, protocol=pickle.HIGHEST_PROTOCOL))
    return [(task, path, dedup) for task in tasks]


def _shard_plan(units, plan: "JobPlan") -> tuple:
    """(sorted units, shard tasks, dedup inputs): what both shuffles plan from the tokenized units."""
    _apply_filesystem_options(plan)
    units = _sorted_units(units)
    # Cross-split dedup needs every held-out id before any shard is packed: one global pass over the units'
    # (small) held-out key ranges here, where all units meet; packers skip ids a winning split or a committed
    # generation holds (stages.DedupInputs: a few paths, cheap to carry in every task).
    dedup = dataclasses.replace(stages.index_held_out_ids(units, plan.staging_dir),
                                committed=plan.committed_id_indexes)
    return units, plan_shard_tasks(units, plan.config), dedup


def _plan_pieces(units, plan: "JobPlan") -> list:
    """The runner's shuffle: one element per unit carrying the shard plan (runner_shuffle.unit_elements)."""
    return runner_shuffle.unit_elements(*_shard_plan(units, plan))


def shuffle_for(p: beam.Pipeline, plan: "JobPlan") -> str:
    """'files' or 'runner': --shuffle resolved for the pipeline's runner (pipeline/ops/runners.py)."""
    return runners.choose_shuffle(plan.config.shuffle, type(p.runner).__name__)


def spread_chunks_needed(plan: JobPlan, options: PipelineOptions) -> bool:
    """Whether the chunks of one input file need their own redistribution step after the split stage.

    The step lets the chunks of a big file tokenize on many workers, which the Pile's 30 files of ~14 GB need.
    It also makes the split stage a barrier: no worker tokenizes until every file is cut. On the local runner
    with at least 4 files per worker, whole files already keep every worker busy, so the step is left out and
    each worker tokenizes a file's chunks as soon as it has cut them (the stage fuses). Remote runners always
    keep it: their worker count is not known here. Output bytes are the same either way: names and order come
    from file and chunk indexes, never from placement.
    """
    opts = options.get_all_options()
    runner = str(opts.get("runner") or "")
    if runner.rsplit(".", 1)[-1] not in ("FnApiRunner", "DirectRunner", "BundleBasedDirectRunner"):
        return True
    workers = int(opts.get("direct_num_workers") or 1)
    return len(plan.ledger) < 4 * max(1, workers)


def build_pipeline(p: beam.Pipeline, plan: JobPlan, spread_chunks: bool = True,
                   shuffle: Optional[str] = None):
    """Attach the shard job to a pipeline; returns the PCollection holding the committed manifest dict.

    The graph has no side inputs and no multi-output steps, and its one sink (the commit) depends on every
    stage through main inputs: the same graph then runs each stage exactly once on every runner, FnApiRunner,
    the portable runner, Dataflow/Flink/Spark and DaskRunner alike (which computes only the last step's graph
    and recomputes side inputs per consumer). `shuffle` ('files' or 'runner', default: `shuffle_for`) picks
    how documents reach their shard (docs/SHUFFLE.md); the output bytes are the same.
    """
    shuffle = shuffle or shuffle_for(p, plan)
    LOG.info("shuffle: %s (--shuffle %s, runner %s)", shuffle, plan.config.shuffle, type(p.runner).__name__)
    files = (p
             | "ListInputs" >> beam.Create([(i, path) for i, (path, _size) in enumerate(plan.ledger)])
             | "SpreadFiles" >> Spread(lambda f: f[0]))
    splits = files | "SplitIntoChunks" >> beam.ParDo(SplitInputFile(plan))
    chunks = splits | "Chunks" >> beam.FlatMap(lambda s: s.result.chunks)
    if spread_chunks:
        chunks = chunks | "SpreadChunks" >> Spread(lambda c: (c.file_idx, c.chunk_idx))
    units = chunks | "Tokenize" >> beam.ParDo(TokenizeChunk(plan))
    if shuffle == "runner":  # pieces through the runner's GroupByKey (pipeline/shard/runner_shuffle.py)
        shards = (units
                  | "CollectUnits" >> GatherAll()
                  | "PlanPieces" >> beam.FlatMap(_plan_pieces, plan)
                  | "SpreadUnits" >> Spread(runner_shuffle.element_key)
                  | "EmitPieces" >> beam.ParDo(runner_shuffle.EmitPieces(plan))
                  | "GroupPieces" >> beam.GroupByKey()
                  | "PackShards" >> beam.ParDo(runner_shuffle.PackGroupedShard(plan)))
    else:
        shards = (units
                  | "CollectUnits" >> GatherAll()
                  | "PlanShards" >> beam.FlatMap(_plan_shards, plan)
                  | "SpreadShards" >> Spread(lambda tu: (tu[0].split, tu[0].shard))
                  | "PackShards" >> beam.ParDo(PackShard(plan)))
    return ((splits | "TagSplits" >> _tagged("split"),
             units | "TagUnits" >> _tagged("unit"),
             shards | "TagShards" >> _tagged("shard"))
            | "GatherForCommit" >> beam.Flatten()
            | "CollectForCommit" >> GatherAll()
            | "CommitManifest" >> beam.Map(_commit, plan))


def pipeline_options(beam_args) -> PipelineOptions:
    args = runners.normalise_beam_args(beam_args or [])
    if not any(a.startswith("--runner") for a in args):
        args = default_beam_args() + args
    return PipelineOptions(args)


def run(config: ShardConfig, beam_args=None, incremental_run: bool = False, run_log: Optional[str] = None,
        progress_every_s: float = 10.0) -> dict:
    """Run the shard job to completion and return the committed manifest as a dict.

    `incremental_run`: add only new input files as a new generation (pipeline/ops/incremental.py). `run_log`:
    JSON-lines event log (pipeline/ops/runlog.py). `progress_every_s`: progress line period (0 = off).
    """
    options = pipeline_options(beam_args)
    memory.configure_child_processes()
    FileSystems.set_options(options)  # the driver lists inputs and reads the manifest with the job's S3 settings
    log = runlog.RunLog(run_log)
    log.event("start", output=config.output, inputs=list(config.inputs), incremental=incremental_run,
              runner=options.get_all_options().get("runner"), config=config.to_manifest_dict())
    try:
        with _signals_interrupt():
            return _run(config, options, incremental_run, log, progress_every_s)
    except RunInterrupted as e:
        log.event("interrupted", signal=e.signum)
        raise
    except Exception as e:
        log.event("error", type=type(e).__name__, message=incremental.redact(str(e)))
        raise
    finally:
        log.close()


@contextlib.contextmanager
def _signals_interrupt():
    """SIGINT / SIGTERM raise RunInterrupted in the driver, so the run can remove its partial generation and
    the CLI can say so in one line (exit 130 / 143). Only the main thread can take signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, _frame):
        raise RunInterrupted(signum)

    saved = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _stop_in_process_workers() -> None:
    """Worker threads of this process stop before the driver removes what they write (pipeline/shard/cancel.py)."""
    if not cancel.cancel_and_wait():
        LOG.warning("in-process workers did not stop within 30 s; removing the partial generation anyway")


def _abandon(plan: JobPlan) -> None:
    """After a failure or an interrupt: remove this run's partial generation (unless it was committed after
    all) and its staging; the previous dataset is untouched."""
    try:
        committed = commit.read_committed(plan.config.output)
        if plan.generation not in incremental.referenced_generations(committed):
            io_utils.delete_tree(plan.data_dir)
        io_utils.delete_tree(plan.staging_dir)
    except Exception as e:  # noqa: BLE001 - the next run removes what is left (staging marker, lock held)
        LOG.warning("could not remove the partial generation %s: %s", plan.data_dir, type(e).__name__)


def _one_line_failure(e: BaseException, plan: JobPlan) -> Optional[RunError]:
    """A RunError for failures with a known cause (Beam wraps worker exceptions in its own, with tracebacks)."""
    text = str(e)
    if isinstance(e, RunError):
        return e
    if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in text:
        return RunError(f"no space left on device while writing {plan.data_dir} or {plan.staging_dir}; the partial "
                        "generation was removed and the previous dataset is intact. Free space (or choose another "
                        "--output / --staging-dir) and run again")
    found = re.search(r"RunError: ([^\n]+)", text)
    return RunError(found.group(1).strip()) if found else None


def _run(config, options, incremental_run, log, progress_every_s) -> dict:
    runners.preflight(options.get_all_options())
    fs_options = FilesystemOptions.from_pipeline_options(options)
    storage.preflight(config.inputs, config.output, config.staging_dir, fs_options.options if fs_options else {})
    commit.check_staging_dir(config.output, config.staging_dir)
    guards.check_local_writable(config.output, "--output")
    guards.check_local_writable(config.staging_dir, "--staging-dir")
    with lock.OutputLock(config.output, fs_options.options if fs_options else {}).held(config.break_lock):
        return _run_locked(config, options, incremental_run, log, progress_every_s, fs_options)


def _run_locked(config, options, incremental_run, log, progress_every_s, fs_options) -> dict:
    plan = dataclasses.replace(prepare(config, incremental_run), filesystem_options=fs_options)
    committed = plan.previous
    removed = guards.cleanup_abandoned(config.output, plan.staging_dir.rstrip("/").rsplit("/", 1)[0], committed)
    if removed:
        LOG.warning("removed what an interrupted or crashed run left: %s", ", ".join(removed))
        log.event("cleanup", removed=removed)
    for row in plan.skipped_inputs:
        LOG.warning("--input matched %s, a %s; skipped", row["path"], row["reason"].replace("_", " "))
        log.event("warning", skipped_input=row["path"], reason=row["reason"])
    log.event("plan", generation=plan.generation, files=len(plan.ledger), input_bytes=plan.input_bytes,
              incremental=plan.incremental)
    if plan.nothing_to_do:
        LOG.warning("%s: every input file is already in the dataset: nothing to do", config.output)
        print(f"pileprep: nothing to do: {config.output} already holds every input file", flush=True)
        log.event("nothing_to_do", generation=committed.generation if committed else None)
        return committed.to_dict()
    if (committed is not None and not plan.incremental
            and incremental.referenced_generations(committed) == {plan.generation}):
        LOG.info("%s already holds generation %s: nothing to do", config.output, plan.generation)
        print(f"pileprep: nothing to do: {config.output} already holds generation {plan.generation}", flush=True)
        log.event("nothing_to_do", generation=plan.generation)
        return committed.to_dict()
    guards.mark_staging(plan.staging_dir, config.output, plan.generation)
    try:
        return _execute(stage_model(plan), options, log, progress_every_s)
    except BaseException as e:  # in-process workers were stopped in _execute, before anything is removed
        _abandon(plan)
        if isinstance(e, KeyboardInterrupt):
            raise RunInterrupted(signal.SIGINT) from None
        if isinstance(e, RunInterrupted):
            raise
        failure = _one_line_failure(e, plan)
        if failure is None:
            raise
        raise failure from None


def _execute(plan: JobPlan, options, log, progress_every_s) -> dict:
    config = plan.config
    started = time.time()
    cancel.reset()
    holder: dict = {}
    markers = progress.MarkerReader(plan.staging_dir)
    reporter = progress.ProgressReporter(
        [markers.snapshot, lambda: progress.counters_from_result(holder["result"]) if "result" in holder else {}],
        plan.input_bytes, len(plan.ledger), progress_every_s,
        on_progress=lambda pr: log.event("progress", **pr.to_dict()))
    try:
        with reporter:
            p = beam.Pipeline(options=options)
            shuffle = shuffle_for(p, plan)
            log.event("shuffle", shuffle=shuffle, choice=config.shuffle)
            build_pipeline(p, plan, spread_chunks_needed(plan, options), shuffle)
            holder["result"] = result = p.run()  # FnApiRunner returns when done; portable runners at once
            result.wait_until_finish()
        elapsed = time.time() - started
        state = str(getattr(result, "state", "DONE"))
        if "FAIL" in state.upper() or "CANCEL" in state.upper():
            raise RuntimeError(f"the pipeline ended in state {state}; nothing was committed")
        counters = progress.merge_snapshots(progress.counters_from_result(result), markers.snapshot())
    except BaseException:
        _stop_in_process_workers()  # before anything is removed: they write markers and spill files
        raise
    finally:
        io_utils.delete_tree(progress.marker_dir(plan.staging_dir))
    counters.pop("split_raw_bytes", None)
    LOG.info("shard job finished in %.1fs (pileprep %s)", elapsed, PILEPREP_VERSION)
    committed = commit.read_committed(config.output)
    if committed is None or committed.generation != plan.generation:
        raise RuntimeError("the pipeline finished but did not commit a manifest")
    final = progress.Progress(elapsed, counters, plan.input_bytes, len(plan.ledger))
    log.event("committed", manifest=commit.manifest_location(config.output), generation=plan.generation,
              generations=len(committed.generations), shards=len(committed.shards),
              splits=committed.splits)
    log.event("summary", wall_s=round(elapsed, 3), **{k: v for k, v in final.to_dict().items() if k != "eta_s"})
    print(progress.summary_table(counters, elapsed), flush=True)
    return committed.to_dict()
