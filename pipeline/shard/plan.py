"""The shard job's plan: what a run will do, decided on the driver before any work starts.

`make_plan` lists the inputs (with their splits), loads the tokenizer, compares with the committed dataset
(for --incremental: only new files), names the generation and picks the tokenizer backend. `decide` turns a
plan into the one decision the job runner (pipeline/job.py) acts on: NothingToDo or Build. The committed
dataset's files are checked for damage at most once, here, and only where a decision depends on it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Optional

from model_contract import DataContract
from pipeline.beam_glue import FilesystemOptions, apply_filesystem_options
from pipeline.config import ShardConfig, fingerprint
from pipeline.errors import ConfigError, RunError
from pipeline.job import Build, Decision, NothingToDo
from pipeline.ops import commit, guards, incremental, input_checks
from pipeline.ops import generations
from pipeline.shard import integrity, markers, source_check, split_inputs
from transforms.shard.records import LedgerEntry
from transforms.io import io_utils, memory
from transforms.tokenize import tokenizer, tokenizer_backends

LOG = logging.getLogger("pileprep.shard")
MODEL_FILE_NAME = "tokenizer.model"


@dataclass(frozen=True)
class JobPlan:
    """Everything decided on the driver before the pipeline starts."""
    config: ShardConfig
    ledger: list[LedgerEntry]  # sorted by path; a file's position is its file_idx
    model_bytes: bytes
    contract: DataContract
    generation: str
    data_dir: str
    staging_dir: str
    # Ops (pipeline/ops/incremental.py, pipeline/ops/commit.py): the ledger rows {path, bytes, mtime[, etag]} of the
    # files this generation ingests (heterogeneous JSON rows), the committed manifest the run started from, and
    # whether to add to it.
    input_rows: tuple[dict[str, Any], ...] = ()
    previous_json: Optional[str] = None
    incremental: bool = False
    nothing_to_do: bool = False
    filesystem_options: Optional[FilesystemOptions] = None
    # Splits and dedup (pipeline/shard/split_inputs.py, transforms/shard/doc_ids.py): per ledger file its split
    # (HASHED for train inputs), and the id indexes of the committed generations new documents are checked against.
    input_splits: tuple[int, ...] = ()  # a split index or HASHED (transforms/shard/documents.py)
    committed_id_indexes: tuple[str, ...] = ()
    tokenizer_backend: Optional["tokenizer_backends.BackendChoice"] = None
    # glob matches that are not files (directories, dangling symlinks): {"path", "reason"}
    skipped_inputs: tuple[dict[str, str], ...] = ()
    # Once the run starts, the model travels as a staged file (stage_model): every DoFn and Map that holds the
    # plan is pickled (bz2, level 9) into the job graph, and a model in each costs start-up time (docs/BENCHMARKS.md,
    # "Measured choices in the shard job") and megabytes of graph (Dataflow caps a job's graph at 10 MB).
    model_path: Optional[str] = None
    # Resume (pipeline/shard/resume.py): the completion markers of an earlier killed run of this generation that
    # the driver checked; workers reuse those cuts and units instead of redoing them.
    resumed_cuts: frozenset[str] = frozenset()
    resumed_units: frozenset[str] = frozenset()
    resumed_packs: frozenset[str] = frozenset()  # and the packed shards (pack-<split>-<shard>-of-<n>)
    resumed_near_dedup: bool = False  # and the near-dedup stage's output (the graph then leaves the stage out)

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
        """What every DoFn of the job does in setup(): the job's S3 settings, and the malloc settings
        (transforms/io/memory.py)."""
        apply_filesystem_options(self.filesystem_options)
        memory.configure_malloc()

    @property
    def previous(self):
        from model_contract import Manifest  # noqa: PLC0415

        return None if self.previous_json is None else Manifest.from_json(self.previous_json)

    @property
    def input_bytes(self) -> int:
        return sum(e.size for e in self.ledger)


# ------------------------------------------------------------------------------------------------- decision
def decide(plan: JobPlan) -> Decision:
    """The one exit before any work: nothing new (--incremental), or a full build the dataset already holds
    intact (make_plan renamed the generation when its committed files were damaged)."""
    output = plan.config.output
    committed = plan.previous
    if plan.nothing_to_do:
        return NothingToDo(f"nothing to do: {output} already holds every input file",
                           committed.generation if committed else None)
    if (committed is not None and not plan.incremental
            and integrity.referenced_generations(committed) == {plan.generation}):
        return NothingToDo(f"nothing to do: {output} already holds generation {plan.generation}", plan.generation)
    return Build(plan.generation)


# ------------------------------------------------------------------------------------------------- the plan
def make_plan(config: ShardConfig, incremental_run: bool = False, committed=commit.READ,
              filesystem_options: Optional[FilesystemOptions] = None) -> JobPlan:
    """List inputs and load the tokenizer: every failure about the inputs happens here, before any work.

    `config` is already checked (pipeline/shard/preflight.py: check_config). `committed`: the committed
    manifest the run starts from (read here by default; the job runner passes the one it read under the lock).
    With `incremental_run`, only input files the committed dataset does not hold yet are planned (changed or
    removed ones are an error, see pipeline/ops/incremental.py); `nothing_to_do` says there are none.
    """
    rows, split_of_path = split_inputs.list_inputs_with_splits(config)
    for warning in split_inputs.held_out_name_warnings(split_of_path):
        LOG.warning("%s", warning)
    skipped = guards.skipped_inputs(tuple(config.inputs) + tuple(config.val_inputs) + tuple(config.test_inputs))
    rows, skipped = input_checks.screen_listed(rows, skipped, config.output,
                                               guards.staging_root(config.output, config.staging_dir))
    model_bytes = tokenizer.read_model_bytes(config.tokenizer)
    options = tokenizer.options_of(config)
    sp = tokenizer.load_processor(model_bytes, config.tokenizer, options)
    contract = DataContract.for_tokens(config.seq_len, tokenizer.describe(sp, model_bytes, options))
    previous = commit.read_committed(config.output) if committed is commit.READ else committed
    if incremental_run and previous is not None:
        rows = _new_rows(config, previous, contract, rows)
    elif previous is not None and not config.overwrite:
        check_same_config(config, contract, previous)
    input_checks.check_compression(rows)
    if rows:  # a --text-field that no record has would dead-letter everything: say so before any work
        guards.sample_text_field([r["path"] for r in rows], config.text_field, config.max_line_bytes)
        source_check.check_source_weights(config, [r["path"] for r in rows])  # a named source must exist
    ledger = [LedgerEntry(r["path"], r["bytes"]) for r in rows]
    adds_to_committed = incremental_run and previous is not None
    generation = generation_name(config, contract, ledger, previous, adds_to_committed, nothing_new=not rows)
    staging_dir = guards.staging_dir_for(config.output, config.staging_dir, generation)
    backend = tokenizer_backends.choose_backend(config.tokenizer_backend, model_bytes, sp,
                                                _parity_sample(config, [e.path for e in ledger]),
                                                failed=markers.failed_backends(staging_dir))
    return JobPlan(config, ledger, model_bytes, contract, generation, io_utils.join(config.output, generation),
                   staging_dir, input_rows=tuple(rows),
                   previous_json=None if previous is None else previous.to_json(),
                   incremental=adds_to_committed, nothing_to_do=not rows, tokenizer_backend=backend,
                   input_splits=split_inputs.input_splits_for(ledger, split_of_path),
                   committed_id_indexes=integrity.committed_id_indexes(previous, config.output)
                   if adds_to_committed else (),
                   skipped_inputs=tuple(skipped), filesystem_options=filesystem_options)


def _new_rows(config: ShardConfig, previous, contract: DataContract, rows: list) -> list:
    """--incremental: the ledger rows the committed dataset does not hold (changed or removed files refuse)."""
    incremental.check_compatible(previous, contract.to_dict(), config.to_manifest_dict())
    diff = incremental.diff_ledger(integrity.ledger_of(previous), rows)
    LOG.info("--incremental over %s: %s", config.output, diff.summary())
    for row in diff.touched:
        LOG.info("%s: mtime/ETag changed but the bytes did not (sha256 matches); not re-ingested", row["path"])
    incremental.raise_for_changes(diff, config.output)
    return diff.new


# Config keys whose change is a new build of the same dataset, not another dataset: the input globs (the files
# they match are the ledger's business).
INPUT_KEYS = ("inputs", "val_inputs", "test_inputs")


def config_differences(config: ShardConfig, contract: DataContract, previous) -> list:
    """What this run would make differently from the committed dataset, as 'key old → new': the config keys, or
    when they all agree, the contract's (the tokenizer model changed at the same path: its sha256). The contract
    follows from the config otherwise (a new seq_len changes every feature's shape), so it is not repeated."""
    old_cfg, new_cfg = dict(previous.config), config.to_manifest_dict()
    out = [f"{k} {old_cfg.get(k)!r} → {new_cfg.get(k)!r}".replace("'", "") for k in sorted(set(old_cfg) | set(new_cfg))
           if k not in INPUT_KEYS and old_cfg.get(k) != new_cfg.get(k)]
    old_c, new_c = previous.contract.to_dict(), contract.to_dict()
    for k in sorted(set(old_c) | set(new_c)) if not out else ():
        if old_c.get(k) != new_c.get(k):
            old_v, new_v = old_c.get(k), new_c.get(k)
            if isinstance(old_v, dict) and isinstance(new_v, dict):
                out += [f"{k}.{f} {old_v.get(f)} → {new_v.get(f)}" for f in sorted(set(old_v) | set(new_v))
                        if old_v.get(f) != new_v.get(f)]
            else:
                out.append(f"{k} {old_v} → {new_v}")
    return out


def check_same_config(config: ShardConfig, contract: DataContract, previous) -> None:
    """A full build into a committed dataset of another configuration would silently replace it (readers
    expecting seq_len 512 would get 1024): exit 2 naming what differs, unless --overwrite."""
    differences = config_differences(config, contract, previous)
    if differences:
        shown = "; ".join(differences[:4]) + (f"; and {len(differences) - 4} more" if len(differences) > 4 else "")
        raise ConfigError(f"--output {config.output} holds a dataset made with another configuration ({shown}); "
                          "pass --overwrite to replace it, or choose another --output")


def generation_name(config: ShardConfig, contract: DataContract, ledger: list, previous, adds_to_committed: bool,
                    nothing_new: bool = False) -> str:
    """`gen-<fingerprint>` of config + tokenizer + ledger (+ the live generations it builds on, incrementally).

    A full build whose name a committed multi-generation (or damaged) dataset already uses takes a new name:
    never write into a live generation's directory (a reader or a crash would see it half-written). The
    committed files are checked (sizes) only when that, or "nothing to do", depends on them: once.
    """
    live = integrity.referenced_generations(previous)
    sha = contract.tokenizer.model_sha256
    inputs = [(e.path, e.size) for e in ledger]  # hashed as (path, size) pairs: the names of committed generations
    generation = "gen-" + fingerprint(config, sha, inputs, parents=live if adds_to_committed else ())
    needs_check = previous is not None and (nothing_new or (not adds_to_committed and live == {generation}))
    damaged = guards.damaged_files(config.output, previous) if needs_check else []
    if needs_check and not nothing_new and not adds_to_committed:  # same (path, size) pairs: same bytes too?
        changed = integrity.changed_inputs(previous, [e.path for e in ledger])
        for line in changed[:5]:
            LOG.warning("rebuilding: %s", line)
        damaged += changed
    if nothing_new and damaged:  # "nothing to do" only over a dataset whose files are all there
        raise RunError(f"{config.output}: the committed dataset is damaged ({len(damaged)} file(s): "
                       f"{'; '.join(damaged[:3])}); rebuild it without --incremental")
    if not adds_to_committed and generation in live and (live != {generation} or damaged):
        generation = "gen-" + fingerprint(config, sha, inputs, parents=live)
    elif not adds_to_committed and generation not in live and generation in generations.retained(config.output):
        # a kept previous generation (pipeline/ops/generations.py) may be in use: never rewrite it in place
        generation = "gen-" + fingerprint(config, sha, inputs, parents=live | {generation})
    return generation


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

    if config.tokenizer_backend in ("sentencepiece", "reference"):
        return []
    return tokenizer_backends.sample_documents(paths, config.text_field, config.seed, read=read, parse=parse)
