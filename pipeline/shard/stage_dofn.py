"""The shard job's stages as Beam DoFns: one generic `StageDoFn` and the four stages it runs.

A stage DoFn takes one element, and for it: reuses the result an earlier run of this generation finished (its
completion marker listed by the driver's reconcile and its files' sha256 checked here, pipeline/shard/markers.py)
or computes it with the stage's pure function in transforms/shard/, marks it finished, and counts it (Beam's
counters and a progress marker, pipeline/ops/progress.py). All of it runs inside cancel.call: once the driver
has cancelled the run and seen no call running, nothing writes into the staging it removes
(pipeline/shard/cancel.py), and the element is dropped.

  CutInputFile        (file_idx, path, chunk_bytes) -> CutOutput     transforms/shard/cut.py cut_input_file
  TokenizeChunk       ChunkRef                      -> UnitResult    transforms/shard/tokenize_unit.py
  CutAndTokenizeFile  (file_idx, path, chunk_bytes) -> TokenizedFile both in one worker, no chunk spilled
  PackShard           (task, unit list, dedup)      -> ShardResult   transforms/shard/pack.py pack_shard
  (pipeline/shard/runner_shuffle.py PackGroupedShard: a PackStage fed by the runner's shuffle)
"""
from __future__ import annotations

import pickle
from typing import Any, Callable, Optional

from apache_beam.metrics import Metrics

from pipeline.beam_glue import PlanDoFn
from pipeline.ops import progress
from pipeline.shard import cancel, input_digests, markers
from pipeline.shard.near_dedup import settings as near_dedup_settings
from transforms.io import io_utils
from transforms.shard import corpus_stats, cut, pack, tokenize_unit
from transforms.shard.records import ChunkRef, CutOutput, ShardResult, ShardTask, TokenizedFile, UnitResult
from transforms.tokenize import tokenizer, tokenizer_backends, worker_cache


def reuse_or_compute(reuse: Callable[[], Any], compute: Callable[[], Any], mark: Callable[[Any], None],
                     count: Callable[[Any, bool], None]):
    """The earlier run's result (`reuse()`, None when there is none or it no longer checks), else `compute()`'s,
    marked finished; counted either way (`count(result, reused)`)."""
    result = reuse()
    reused = result is not None
    if not reused:
        result = compute()
        mark(result)
    count(result, reused)
    return result


class StageDoFn(PlanDoFn):
    """One stage over its elements: `reuse`, `compute`, `mark` and `count` one element's result."""

    def process(self, element):
        result = cancel.call(self.run_one, element)
        if result is not None:  # None: the driver cancelled the run (pipeline/shard/cancel.py)
            yield result

    def run_one(self, element):
        return reuse_or_compute(lambda: self.reuse(element), lambda: self.compute(element), self.mark,
                                lambda result, reused: self.count(element, result, reused))

    def reuse(self, element) -> Optional[Any]:
        raise NotImplementedError

    def compute(self, element) -> Any:
        raise NotImplementedError

    def mark(self, result) -> None:
        raise NotImplementedError

    def count(self, element, result, reused: bool) -> None:
        raise NotImplementedError


# ------------------------------------------------------------------------------------------------- cut
def _cut_options(cfg) -> dict:
    """The config's arguments for cutting an input file (transforms/shard/cut.py InputCutter)."""
    return {"unit_bytes": cfg.unit_bytes, "max_line_bytes": cfg.max_line_bytes,
            "max_zstd_window_bytes": cfg.max_zstd_window_bytes, "fields": (cfg.text_field, *cfg.source_fields)}


def _count_cut(plan, output: CutOutput) -> None:
    """A cut file's counters: Beam's and a progress marker (runners without live metrics)."""
    Metrics.counter(progress.NAMESPACE, "input_files").inc()
    Metrics.counter(progress.NAMESPACE, "input_bytes").inc(output.digest.bytes)
    # "split_raw_bytes": the raw text bytes the cut stage made, pipeline/ops/progress.py's key for the ETA. Named
    # before the stage was called "cut" and kept: the run log's progress events carry every counter under its
    # key (docs/OPERATIONS.md), so a rename would change the --run-log output that readers parse.
    progress.write_marker(plan.staging_dir, markers.cut_marker_name(output.result.file_idx), {
        "input_files": 1, "input_bytes": output.digest.bytes,
        "split_raw_bytes": sum(c.raw_bytes for c in output.result.chunks)})


def _reused_cut(plan, file_idx: int, spilled: bool) -> Optional[CutOutput]:
    """An earlier run's cut of file `file_idx` made the way this run needs it (`spilled`), when it still checks."""
    if markers.cut_marker_name(file_idx) not in plan.resumed_cuts:
        return None
    return markers.load_cut(plan, file_idx, spilled)


class CutInputFile(StageDoFn):
    """Cuts one input file into line-aligned chunks in staging; yields a CutOutput. The input's digest is
    recorded before it is cut (pipeline/shard/input_digests.py) and travels in the CutOutput."""

    def reuse(self, element) -> Optional[CutOutput]:
        return _reused_cut(self.plan, element[0], spilled=True)

    def compute(self, element) -> CutOutput:
        file_idx, path, chunk_bytes = element
        digest = input_digests.mark_input(self.plan, file_idx, path)
        return CutOutput(cut.cut_input_file(file_idx, path, self.plan.staging_dir, self.plan.data_dir,
                                            check_cancelled=cancel.check, chunk_bytes=chunk_bytes,
                                            **_cut_options(self.plan.config)), digest)

    def mark(self, result: CutOutput) -> None:
        markers.mark_cut(self.plan, result)

    def count(self, element, result: CutOutput, reused: bool) -> None:
        _count_cut(self.plan, result)


# -------------------------------------------------------------------------------------------- tokenize
class TokenizeChunk(StageDoFn):
    """Loads the tokenizer once per worker (setup), then tokenizes whole chunks from their spilled files."""

    def __init__(self, plan):
        super().__init__(plan)
        self.counters = {name: Metrics.counter(progress.NAMESPACE, name) for name in (
            "documents", "tokens", "records", "raw_bytes", "units_tokenized", "units_reused")}

    def setup(self):
        super().setup()
        model_bytes = self.plan.tokenizer_model()
        cfg = self.plan.config
        # Loaded once per worker thread: DaskRunner runs setup() per partition (transforms/tokenize/worker_cache.py)
        options = (cfg.tokenizer, tokenizer.options_of(cfg), self.plan.tokenizer_backend,
                   getattr(cfg, "max_pretoken_mb", None))
        self.sp, self.byte_mask, long_docs = worker_cache.cached(model_bytes, options, lambda: self._load(model_bytes))
        self.dtype = tokenizer.token_dtype(self.plan.contract.tokenizer.vocab_size)
        self.settings = tokenize_unit.TokenizeSettings(
            cfg.text_field, tuple(cfg.source_fields), cfg.val_fraction, cfg.test_fraction, cfg.seed,
            self.plan.input_splits, long_docs, near_dedup_settings.tokenize_signing(cfg))

    def _load(self, model_bytes: bytes) -> tuple:
        cfg = self.plan.config
        sp = tokenizer.load_processor(model_bytes, cfg.tokenizer, tokenizer.options_of(cfg))
        encoder = sp if self.plan.tokenizer_backend is None else tokenizer_backends.make_encoder(
            self.plan.tokenizer_backend, model_bytes, sp)
        return encoder, corpus_stats.byte_piece_mask(encoder), tokenizer.long_document_plan(encoder, model_bytes, cfg)

    def reuse(self, chunk: ChunkRef) -> Optional[UnitResult]:
        if markers.unit_marker_name(chunk.unit_name) not in self.plan.resumed_units:
            return None
        return markers.load_unit(self.plan, chunk.unit_name)  # None: a file did not match its sha256

    def compute(self, chunk: ChunkRef) -> UnitResult:
        return self._tokenized(lambda: tokenize_unit.tokenize_chunk(
            chunk, self.sp, self.dtype, self.settings, self.plan.staging_dir, self.plan.data_dir, self.byte_mask,
            cancel.check))

    def _tokenized(self, tokenize: Callable[[], UnitResult]) -> UnitResult:
        """`tokenize()`'s unit. A failed spot check is recorded in the staging first (markers.py
        mark_backend_failed; the driver's keep_finished keeps the record): no later run of this generation picks
        this backend again or reuses a unit it made. Both tokenize graphs come here."""
        try:
            return tokenize()
        except tokenizer_backends.BackendMismatchError:
            markers.mark_backend_failed(self.plan)
            raise

    def mark(self, unit: UnitResult) -> None:
        markers.mark_unit(self.plan, unit)

    def count(self, chunk: ChunkRef, unit: UnitResult, reused: bool) -> None:
        """A unit's counters: Beam's and a progress marker (runners without live metrics)."""
        what = "units_reused" if reused else "units_tokenized"
        counts = {"documents": unit.n_docs, "tokens": sum(unit.split_tokens), "records": unit.stats.read,
                  "raw_bytes": chunk.raw_bytes, what: 1}
        for name, n in counts.items():
            self.counters[name].inc(n)
        progress.write_marker(self.plan.staging_dir, markers.unit_marker_name(unit.name),
                              {**counts, "dead_letters": sum(unit.stats.dead_lettered.values())})


class CutAndTokenizeFile(TokenizeChunk):
    """Cuts one input file into chunks and tokenizes each as it is cut, in this worker: the chunks never go
    through staging (transforms/shard/cut.py InputCutter). For graphs where a file's chunks would stay on the
    worker that cut them anyway (pipeline/shard/graph.py spread_chunks_needed false) and nothing reads the chunks
    later (no near-dedup stage): the zstd spill and its read back cost CPU for nothing (how much:
    docs/BENCHMARKS.md, "Measured choices in the shard job").

    Same units, names and bytes as CutInputFile + TokenizeChunk. Resume: each unit is reused or tokenized,
    marked and counted as its chunk is cut, and the file's cut (chunk sizes, digest, damage) marked once all are;
    a rerun reuses a file whose cut and units are all marked without reading it, and otherwise reads it again
    and tokenizes only the chunks whose units are not."""

    def run_one(self, element) -> TokenizedFile:
        file_idx, path, chunk_bytes = element
        output = _reused_cut(self.plan, file_idx, spilled=False)
        units = None if output is None else [self.reuse(c) for c in output.result.chunks]
        if units is not None and all(u is not None for u in units):
            for unit, chunk in zip(units, output.result.chunks):
                self.count(chunk, unit, True)
        else:
            digest = input_digests.mark_input(self.plan, file_idx, path)
            cutter = cut.InputCutter(file_idx, path, check_cancelled=cancel.check, chunk_bytes=chunk_bytes,
                                     **_cut_options(self.plan.config))
            units = [self._unit(chunk, records) for chunk, records in cutter.chunks()]
            output = CutOutput(cutter.finish(self.plan.data_dir, list(cutter.refs), spilled=False), digest)
            markers.mark_cut(self.plan, output)
        _count_cut(self.plan, output)
        return TokenizedFile(output, tuple(units))

    def _unit(self, chunk: ChunkRef, records: list) -> UnitResult:
        return reuse_or_compute(
            lambda: self.reuse(chunk),
            lambda: self._tokenized(lambda: tokenize_unit.tokenize_records(
                chunk, records, self.sp, self.dtype, self.settings, self.plan.staging_dir, self.plan.data_dir,
                self.byte_mask, cancel.check)),
            self.mark, lambda unit, reused: self.count(chunk, unit, reused))


# ------------------------------------------------------------------------------------------------- pack
class PackStage(StageDoFn):
    """What both packers share: reuse, mark and count by the shard's task. `compute` packs."""

    def task_of(self, element) -> ShardTask:
        raise NotImplementedError

    def reuse(self, element) -> Optional[ShardResult]:
        task = self.task_of(element)
        if markers.pack_marker_name(task) not in self.plan.resumed_packs:
            return None
        return markers.load_pack(self.plan, task)

    def mark(self, result: ShardResult) -> None:
        markers.mark_pack(self.plan, result)

    def count(self, element, result: ShardResult, reused: bool) -> None:
        """A packed shard's counters: Beam's (examples, shards packed or reused) and a progress marker."""
        what = "shards_reused" if reused else "shards_packed"
        Metrics.counter(progress.NAMESPACE, "examples").inc(result.examples)
        Metrics.counter(progress.NAMESPACE, what).inc()
        progress.write_marker(self.plan.staging_dir, markers.pack_marker_name(result.task), {what: 1})

    def pack(self, task: ShardTask, units: list, dedup, gathered: Optional[tuple] = None) -> ShardResult:
        t, cfg = self.plan.contract.tokenizer, self.plan.config
        return pack.pack_shard(task, units, cfg.seq_len, t.eos_id, t.pad_id, self.plan.data_dir, dedup,
                               self.plan.staging_dir, cfg.mixture_weights, cfg.seed, gathered,
                               packing=cfg.packing, packing_window=cfg.packing_window)


class PackShard(PackStage):
    """One shard from the units' spill files: (task, path of the staged unit list, dedup inputs)."""

    def _units(self, path: str) -> list:
        if getattr(self, "_units_path", None) != path:  # read once per worker (pipeline/shard/graph.py)
            self._units_list = pickle.loads(io_utils.read_bytes(path))
            self._units_path = path
        return self._units_list

    def task_of(self, element) -> ShardTask:
        return element[0]

    def compute(self, element) -> ShardResult:
        task, units_path, dedup = element
        return self.pack(task, self._units(units_path), dedup)
