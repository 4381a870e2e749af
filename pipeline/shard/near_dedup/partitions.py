"""The stage's outputs: each id partition's removals (an id index per reason for the packers, a sidecar of
rows for the dataset), then, once everything is gathered, the generation's summary and the packers' marker."""
from __future__ import annotations

import collections
import hashlib
import json

import numpy as np

from pipeline.shard import markers
from pipeline.shard.near_dedup import eval_sets, unit_docs
from pipeline.shard.near_dedup.elements import BandIndexWritten, ClusterSize, PartitionWritten, Release
from transforms.io import io_utils
from transforms.shard import doc_ids
from transforms.shard.near_dedup import clusters, minhash, paths, removals, shingling

EXCERPT_CHARS = 400  # of each example pair's texts in the summary
EXAMPLE_PAIRS = 3  # near-duplicate pairs (and contaminated documents) the summary shows


def write_partition(kv, plan) -> PartitionWritten:
    """One id partition's removals: an id index per reason (staging, for the packers) and its sidecar rows
    (the generation's `near-dedup/`), sorted by id. One id with two rows (a contaminated train copy and a
    near-duplicate held-out copy) keeps the reason that comes first in removals.REASONS."""
    partition, rows = kv
    order = {r: i for i, r in enumerate(removals.REASONS)}
    best: dict = {}
    for row in rows:
        key = (order[row["reason"]], json.dumps(row, sort_keys=True))
        if row["id"] not in best or key < best[row["id"]][0]:
            best[row["id"]] = (key, row)
    chosen = [best[i][1] for i in sorted(best)]
    indexes = []
    for reason in removals.REASONS:
        ids = np.array([r["id"] for r in chosen if r["reason"] == reason], dtype=doc_ids.ID_DTYPE)
        if ids.size:
            path = paths.removal_index(plan.staging_dir, reason, partition)
            doc_ids.write_index(path, iter([ids]), int(ids.size))
            indexes.append((reason, path))
    sidecar = paths.sidecar(plan.data_dir, partition)
    io_utils.write_jsonl(sidecar, [{k: v for k, v in r.items() if k not in ("loc", "keeper_loc")}
                                   for r in chosen])
    examples = [r for r in chosen if r["reason"] == removals.NEAR_DUPLICATE][:EXAMPLE_PAIRS]
    contaminated = [r for r in chosen if r["reason"] == removals.CONTAMINATED][:EXAMPLE_PAIRS]
    return PartitionWritten(partition, tuple(indexes), sidecar, tuple(examples), tuple(contaminated),
                            dict(collections.Counter(r["reason"] for r in chosen)))


def summary_of(plan, parts: list, sizes: collections.Counter, band_files: list) -> dict:
    """The generation's near-dedup summary (read into the manifest's `near_dedup` section, manifest.py)."""
    cfg = plan.config
    examples = sorted((e for p in parts for e in p.examples), key=lambda e: e["id"])[:EXAMPLE_PAIRS]
    pairs = [{"removed": e["id"], "keeper": e["keeper"], "jaccard": e["jaccard"], "source": e["source"],
              "keeper_source": e["keeper_source"],
              "removed_text": unit_docs.text_at(plan, e["loc"])[:EXCERPT_CHARS],
              "keeper_text": unit_docs.text_at(plan, e["keeper_loc"])[:EXCERPT_CHARS]} for e in examples]
    contaminated = sorted((e for p in parts for e in p.contaminated_examples), key=lambda e: e["id"])[:EXAMPLE_PAIRS]
    sidecars = []
    for p in parts:
        size, sha = _digest(p.sidecar)
        sidecars.append({"path": _dataset_relative(p.sidecar, cfg.output), "bytes": size, "sha256": sha})
    summary = {
        "near_dedup": cfg.near_dedup_config.enabled,
        "decontaminate": ([eval_sets.name(p) for p in eval_sets.eval_files(cfg)] if cfg.decontaminate_config.enabled
                          else []),
        "removed": dict(sorted(sum((collections.Counter(p.removed) for p in parts), collections.Counter())
                               .items())),
        "cluster_sizes": clusters.cluster_size_bins(
            [size for size, n in sorted(sizes.items()) for _ in range(n)]),
        "example_pairs": pairs,
        "contaminated_examples": [{k: e[k] for k in ("id", "source", "eval_file", "ngram")} for e in contaminated],
        "sidecars": sidecars,
    }
    if band_files:
        summary["band_index"] = [{"range": b.range, "path": _dataset_relative(b.path, cfg.output),
                                  "rows": b.rows, "bytes": b.bytes, "sha256": b.sha256} for b in band_files]
    near = cfg.near_dedup_config
    if near.enabled:
        summary["minhash"] = {"bands": near.bands, "rows": near.rows, "threshold": near.threshold,
                              "verify": near.verify, "shingle_words": shingling.SHINGLE_WORDS,
                              "sketch": near.params.sketch, "s_curve": minhash.s_curve_text(near.bands, near.rows)}
        if near.shingles != shingling.DEFAULT_SHINGLES:  # absent at the default: sections as before
            summary["minhash"].update(shingles=near.shingles, shingle_tokens=shingling.SHINGLE_TOKENS)
    for e in summary["contaminated_examples"]:
        e["eval_file"] = eval_sets.name(e["eval_file"])
    return summary


def finish(gathered: list, plan) -> None:
    """The stage's last step (one element): the generation's summary file, the packers' marker, and the stage's
    completion marker."""
    parts = sorted((e for e in gathered if isinstance(e, PartitionWritten)), key=lambda p: p.partition)
    sizes = collections.Counter(e.size for e in gathered if isinstance(e, ClusterSize))
    indexes = [tuple(i) for p in parts for i in p.indexes]
    io_utils.fsync_files([p for _r, p in indexes] + [p.sidecar for p in parts])
    band_files = sorted((e for e in gathered if isinstance(e, BandIndexWritten)), key=lambda b: b.range)
    io_utils.fsync_files([b.path for b in band_files])
    summary_path = paths.summary(plan.data_dir)
    summary = summary_of(plan, parts, sizes, band_files)
    io_utils.write_bytes(summary_path, json.dumps(summary, sort_keys=True, indent=1).encode("utf-8"))
    staged = [p for _r, p in indexes] + [removals.write_marker(plan.staging_dir, indexes,
                                                               plan.config.decontaminate_config.checked_splits)]
    # The global stage's completion marker, last: a rerun of this generation skips the stage
    # (pipeline/shard/markers.py mark_near_dedup)
    markers.mark_near_dedup(plan, staged, [p.sidecar for p in parts] + [b.path for b in band_files] + [summary_path])


def finish_and_release(gathered: list, plan) -> list:
    """`finish`, then the units, in name order, for the packers."""
    finish(gathered, plan)
    return sorted((e.unit for e in gathered if isinstance(e, Release)), key=lambda u: u.name)


def _digest(path: str) -> tuple:
    data = io_utils.read_bytes(path)
    return len(data), hashlib.sha256(data).hexdigest()


def _dataset_relative(path: str, base: str) -> str:
    from model_contract.dataset_paths import dataset_relative_path  # noqa: PLC0415

    return dataset_relative_path(path, base)
