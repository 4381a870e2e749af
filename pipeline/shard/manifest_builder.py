"""Assembling the manifest from the stages' small results: pure functions, no I/O.

This is also where "nothing is lost" is enforced: for every input file, records read must equal documents
written + filtered + dead-lettered. If they do not, the run fails instead of committing a manifest that lies.
"""
from __future__ import annotations

import collections
import math

from model_contract import DataContract, Manifest, ShardInfo
from model_contract.dataset_paths import dataset_relative_path
from pipeline.config import BYTES_PER_TOKEN_ESTIMATE, PILEPREP_VERSION, ShardConfig
from transforms.shard import corpus_stats, mixture, packing_stats
from transforms.shard.documents import SPLITS
from transforms.shard.records import FileStats, ShardTask


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


def build_manifest(config: ShardConfig, contract: DataContract, ledger: list, generation: str, output_dir: str,
                   cut_results: list, unit_results: list, shard_results: list) -> Manifest:
    files = {e.path: FileStats() for e in ledger}
    for r in cut_results:
        files[r.input_path].merge(r.stats)
    for u in unit_results:
        files[u.input_path].merge(u.stats)
    shard_results = sorted(shard_results, key=lambda s: (s.task.split, s.task.shard))
    sources: dict = collections.defaultdict(dict)
    splits = {}
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
        name = SPLITS[s.task.split]
        agg = splits.setdefault(name, {"documents": 0, "tokens": 0, "padding_tokens": 0, "examples": 0,
                                       "shards": 0})
        agg["documents"] += s.documents
        agg["tokens"] += s.tokens
        agg["padding_tokens"] += s.padding_tokens
        agg["examples"] += s.examples
        agg["shards"] += 1
        for source, counts in s.sources.items():
            per = sources[source].setdefault(name, {"documents": 0, "tokens": 0})
            per["documents"] += counts["documents"]
            per["tokens"] += counts["tokens"]

    problems = []
    totals = FileStats()
    inputs = []
    for entry in ledger:
        path = entry.path
        st = files[path]
        if st.settled() != st.read:
            problems.append(f"{path}: read {st.read} but written+filtered+dead-lettered = {st.settled()}")
        totals.merge(st)
        inputs.append({"path": path, "bytes": entry.size, **st.to_dict()})
    if problems:
        raise ReconciliationError("record counts do not reconcile:\n  " + "\n  ".join(problems))

    examples = sum(s.examples for s in shard_results)
    padding = sum(s.padding_tokens for s in shard_results)
    dead_letters = sorted(dataset_relative_path(p, output_dir) for p in
                          [r.dead_letter_path for r in cut_results] + [u.dead_letter_path for u in unit_results]
                          if p)
    shards = [ShardInfo(path=dataset_relative_path(s.path, output_dir), split=SPLITS[s.task.split],
                        examples=s.examples, tokens=s.tokens, padding_tokens=s.padding_tokens,
                        documents=s.documents, bytes=s.bytes, sha256=s.sha256) for s in shard_results]
    return Manifest(
        contract=contract,
        shards=shards,
        splits=splits,
        sources={k: dict(sorted(v.items())) for k, v in sorted(sources.items())},
        padding_fraction=round(padding / (examples * config.seq_len), 8) if examples else 0.0,
        records=totals.to_dict(),
        inputs=inputs,
        dead_letters=dead_letters,
        config=config.to_manifest_dict(),
        pileprep_version=PILEPREP_VERSION,
        generation=generation,
        extra=_statistics(config, unit_results, shard_results),
    )


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
