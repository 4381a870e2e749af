"""The manifest, built by one function from the stages' small results (`manifest_for`, at the commit), and the
shard plan the pack stage follows (`shard_write_tasks`).

This is also where "nothing is lost" is enforced: for every input file, records read must equal documents
written + filtered + dead-lettered (`tally`). If they do not, the run fails instead of committing a manifest
that lies. `build_manifest` reads nothing but the dead-letter files it hashes; `manifest_for` also writes the
generation's id index.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from model_contract import DataContract, Manifest, ShardInfo
from model_contract.dataset_paths import dataset_relative_path
from pipeline.config import BYTES_PER_TOKEN_ESTIMATE, PILEPREP_VERSION, ShardConfig
from pipeline.ops import commit, guards
from pipeline.shard import integrity
from transforms.io import io_utils
from transforms.shard import corpus_stats, exact_dedup, mixture, packing_stats, tokenize_unit
from transforms.shard.documents import SPLITS
from transforms.shard.records import CommitParts, FileStats, InputFile, ShardTask


class ReconciliationError(RuntimeError):
    """Counts do not add up: a record went missing somewhere. Never committed."""


def shard_write_tasks(units: list, config: ShardConfig) -> list:
    """The shard-writing tasks ([ShardTask], one per output shard): how many shards each split gets, from the
    token counts the tokenize stage reported."""
    totals = [sum(u.split_tokens[s] for u in units) for s in range(len(SPLITS))]
    if config.mixture_weights and not config.num_shards:  # size train shards for the tokens after weighting
        totals[0] = int(totals[0] * mixture.weighted_factor(
            corpus_stats.merge({}, *[u.source_stats for u in units]) if units else {}, config.mixture_weights))
    if config.num_shards:
        tokens_per_shard = max(1, math.ceil(totals[0] / config.num_shards)) if totals[0] else None
    else:
        tokens_per_shard = max(1, int(config.target_shard_mb * (1 << 20) / BYTES_PER_TOKEN_ESTIMATE))
    tasks = []
    for split, tokens in enumerate(totals):
        if tokens == 0:
            continue
        if split == 0 and config.num_shards:
            n = config.num_shards
        elif tokens_per_shard is None:
            n = 1
        else:
            n = max(1, math.ceil(tokens / tokens_per_shard))
        tasks.extend(ShardTask(split, i, n) for i in range(n))
    return tasks


@dataclass(frozen=True)
class Tally:
    """Record counts per input file (ledger order) and in total, once they reconcile."""
    files: dict[str, FileStats]
    totals: FileStats


def tally(ledger: list, cut_results: list, unit_results: list, shard_results: list) -> Tally:
    """Every input file's records, summed from every stage: read must equal written + filtered + dead-lettered,
    file by file, else ReconciliationError naming each file that does not add up (nothing is committed)."""
    files = {e.path: FileStats() for e in ledger}
    for r in cut_results:
        files[r.input_path].merge(r.stats)
    for u in unit_results:
        files[u.input_path].merge(u.stats)
    for s in shard_results:
        for path, n in s.written_per_file.items():
            files[path].written += n
        for path, n in s.duplicates_per_file.items():
            files[path].filter("duplicate", n)
        for path, reasons in s.filtered_per_file.items():  # near-dedup, decontamination
            for reason, n in reasons.items():
                files[path].filter(reason, n)
        for path, n in s.dropped_per_file.items():
            files[path].filter(mixture.DROPPED_REASON, n)
    problems = [f"{path}: read {st.read} but written+filtered+dead-lettered = {st.settled()}"
                for path, st in files.items() if st.settled() != st.read]
    if problems:
        raise ReconciliationError("record counts do not reconcile:\n  " + "\n  ".join(problems))
    totals = FileStats()
    for st in files.values():
        totals.merge(st)
    return Tally(files, totals)


@dataclass(frozen=True)
class CommitFacts:
    """What the commit adds to the stages' results: the generation's id index (exact_dedup.py
    write_generation_id_index: path, documents, bytes, sha256), the ledger rows and what was read of them, the
    glob matches skipped, the tokenizer backend's manifest section, and the committed dataset it adds to."""
    id_index: tuple[str, int, int, str]  # (path, documents, bytes, sha256)
    # ledger rows {path, bytes, mtime[, etag]}: heterogeneous JSON (pipeline/ops/incremental.py)
    input_rows: tuple[dict[str, Any], ...] = ()
    digests: dict[str, InputFile] = field(default_factory=dict)  # path -> InputFile (transforms/shard/records.py)
    skipped_inputs: tuple[dict[str, str], ...] = ()  # {"path", "reason"} (pipeline/ops/guards.py skipped_inputs)
    # the manifest's tokenizer_backend section: heterogeneous JSON (transforms/tokenize/tokenizer_backends.py
    # BackendChoice.to_manifest)
    tokenizer_backend: Optional[dict[str, Any]] = None
    previous: Optional[Manifest] = None  # --incremental: merged on top of it (pipeline/shard/integrity.py merge)


def manifest_for(plan, parts: CommitParts) -> Manifest:
    """The manifest the commit writes, complete, from every stage's results: counts reconciled and the dead-letter
    rate checked first (nothing is written when either fails), then the generation's id index, durable before the
    manifest that references it (pipeline/ops/commit.py)."""
    cuts = [c.result for c in sorted(parts.cuts, key=lambda c: c.result.file_idx)]
    units = sorted(parts.units, key=lambda u: u.name)
    counts = tally(plan.ledger, cuts, units, parts.shards)
    guards.check_dead_letter_rate(counts.totals.to_dict(), plan.config.max_dead_letter_fraction)
    id_index = exact_dedup.write_generation_id_index(parts.shards, plan.data_dir)
    io_utils.fsync_files([id_index[0]])
    backend = plan.tokenizer_backend  # how this generation was tokenized; the only backend-dependent field
    facts = CommitFacts(id_index, tuple(plan.input_rows), {c.digest.path: c.digest for c in parts.cuts},
                        tuple(plan.skipped_inputs),
                        None if backend is None else backend.to_manifest(tokenize_unit.spot_check_totals(units)),
                        plan.previous if plan.incremental else None)
    return build_manifest(plan.config, plan.contract, plan.ledger, plan.generation, plan.config.output, cuts, units,
                          parts.shards, facts)


def build_manifest(config: ShardConfig, contract: DataContract, ledger: list, generation: str, output_dir: str,
                   cut_results: list, unit_results: list, shard_results: list,
                   facts: Optional[CommitFacts] = None) -> Manifest:
    """The manifest of one generation built from its stages' results (counts reconciled first: `tally`), with the
    commit's sections when `facts` are given, merged on top of `facts.previous` when there is one. Without
    `facts` (tests), the counts and statistics alone."""
    counts = tally(ledger, cut_results, unit_results, shard_results)
    shard_results = sorted(shard_results, key=lambda s: (s.task.split, s.task.shard))
    sources: dict = collections.defaultdict(dict)
    splits = {}
    for s in shard_results:
        name = SPLITS[s.task.split]
        agg = splits.setdefault(name, {"documents": 0, "tokens": 0, "padding_tokens": 0, "examples": 0,
                                       "shards": 0})
        agg["documents"] += s.documents
        agg["tokens"] += s.tokens
        agg["padding_tokens"] += s.padding_tokens
        agg["examples"] += s.examples
        agg["shards"] += 1
        for source, per_split in s.sources.items():
            per = sources[source].setdefault(name, {"documents": 0, "tokens": 0})
            per["documents"] += per_split["documents"]
            per["tokens"] += per_split["tokens"]
    inputs = [{"path": e.path, "bytes": e.size, **counts.files[e.path].to_dict()} for e in ledger]
    examples = sum(s.examples for s in shard_results)
    padding = sum(s.padding_tokens for s in shard_results)
    dead_letters = sorted(dataset_relative_path(p, output_dir) for p in
                          [r.dead_letter_path for r in cut_results] + [u.dead_letter_path for u in unit_results]
                          if p)
    shards = [ShardInfo(path=dataset_relative_path(s.path, output_dir), split=SPLITS[s.task.split],
                        examples=s.examples, tokens=s.tokens, padding_tokens=s.padding_tokens,
                        documents=s.documents, bytes=s.bytes, sha256=s.sha256) for s in shard_results]
    extra = _statistics(config, unit_results, shard_results)
    committed: dict = {}
    if facts is not None:
        sections = integrity.integrity_sections(dead_letters, output_dir, generation, shard_results, facts.id_index)
        near_dedup = sections.pop("near_dedup")
        extra.update({} if near_dedup is None else {"near_dedup": near_dedup})
        extra.update({} if facts.tokenizer_backend is None else {"tokenizer_backend": facts.tokenizer_backend})
        committed = dict(sections, ledger=integrity.ledger_rows(generation, list(facts.input_rows), facts.digests),
                         generations=[integrity.generation_row(generation, inputs, shards)],
                         skipped_inputs=[dict(r) for r in facts.skipped_inputs],
                         kind=commit.KIND_DATASET)  # checked before any commit into this output (ops/commit.py)
    manifest = Manifest(
        contract=contract,
        shards=shards,
        splits=splits,
        sources={k: dict(sorted(v.items())) for k, v in sorted(sources.items())},
        padding_fraction=round(padding / (examples * config.seq_len), 8) if examples else 0.0,
        records=counts.totals.to_dict(),
        inputs=inputs,
        dead_letters=dead_letters,
        config=config.to_manifest_dict(),
        pileprep_version=PILEPREP_VERSION,
        generation=generation,
        extra=extra,
        **committed,
    )
    if facts is None or facts.previous is None:
        return manifest
    return integrity.merge(facts.previous, manifest)


def _statistics(config: ShardConfig, unit_results: list, shard_results: list) -> dict:
    """The report's distributions (transforms/shard/corpus_stats.py) and, with weights, the realised mixture."""
    stats: dict = {}
    for u in unit_results:
        corpus_stats.merge(stats, u.source_stats)
    for s in shard_results:
        corpus_stats.merge(stats, s.source_stats)
    out = {"statistics": {"sources": corpus_stats.finish(stats), "length_bins": "log2"}}
    if config.packing != "concat":  # absent at the default packing: a default dataset's manifest bytes stay
        out["packing"] = _packing_section(config, shard_results)
    weights = config.mixture_weights
    if weights:
        train = [s for s in shard_results if s.task.split == 0]
        unique = collections.Counter()
        written = collections.Counter()
        for s in train:
            for source, values in s.source_stats.items():
                unique[source] += values.get("unique_tokens", 0)
            for source, counts in s.sources.items():
                written[source] += counts["tokens"]
        out["mixture"] = {"split": "train", "weights": weights,
                          "sources": mixture.realised_shares(dict(unique), dict(written), weights)}
    return out


def _packing_section(config: ShardConfig, shard_results: list) -> dict:
    """Per split and source: documents split, examples per document, and the split's padding fraction
    (transforms/shard/packing_stats.py)."""
    per_split: dict = {}
    padding: dict = {}
    for s in shard_results:
        name = SPLITS[s.task.split]
        packing_stats.merge(per_split.setdefault(name, {}), s.packing)
        pad, slots = padding.get(name, (0, 0))
        padding[name] = (pad + s.padding_tokens, slots + s.examples * config.seq_len)
    return packing_stats.manifest_section(config.packing, config.packing_window, per_split, padding)
