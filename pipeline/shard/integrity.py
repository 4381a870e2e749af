"""Manifest sections that let readers prove the data and let later runs deduplicate against it.

- `dead_letter_files`: size and sha256 of every dead-letter file (shards carry theirs in `ShardInfo`), so
  `pileprep verify` can check every file a manifest names;
- `doc_id_indexes`: one row per generation — its id index (transforms/shard/doc_ids.py: every document id it holds,
  sorted) with size, sha256 and document count. `--incremental` runs look new documents up there;
- `duplicates_by_source`: exact duplicates removed, counted by the source of the removed copy (the kept copy's
  source is the one in `sources`).

Incremental merges concatenate the lists and sum the counts (pipeline/ops/incremental.py `merge`).
"""
from __future__ import annotations

import collections
from typing import Optional

from model_contract import Manifest
from pipeline.ops import incremental
from pipeline.shard import near_dedup_graph
from pipeline.shard.manifest_builder import _relative
from transforms.io import io_utils

DEAD_LETTER_FILES = "dead_letter_files"
DOC_ID_INDEXES = "doc_id_indexes"
DUPLICATES_BY_SOURCE = "duplicates_by_source"


def add_integrity_sections(manifest: Manifest, output_dir: str, generation: str, shard_results: list,
                           id_index: tuple) -> Manifest:
    """Add this (one-generation) manifest's integrity sections; hashes the generation's dead letters."""
    files = []
    for rel in manifest.dead_letters:
        size, sha = incremental.file_sha256(io_utils.join(output_dir, rel))
        files.append({"path": rel, "bytes": size, "sha256": sha})
    path, documents, size, sha = id_index
    duplicates: collections.Counter = collections.Counter()
    for r in shard_results:
        duplicates.update(r.duplicates_per_source)
    manifest.extra[DEAD_LETTER_FILES] = files
    manifest.extra[DOC_ID_INDEXES] = [{"generation": generation, "path": _relative(path, output_dir),
                                       "documents": documents, "bytes": size, "sha256": sha}]
    manifest.extra[DUPLICATES_BY_SOURCE] = dict(sorted(duplicates.items()))
    manifest.extra.update(near_dedup_graph.manifest_section(shard_results, output_dir, generation))
    return manifest


def merge_integrity_sections(previous: Manifest, new: Manifest) -> dict:
    """The sections of the dataset after an incremental commit of `new` on top of `previous`."""
    duplicates: collections.Counter = collections.Counter(previous.extra.get(DUPLICATES_BY_SOURCE, {}))
    duplicates.update(new.extra.get(DUPLICATES_BY_SOURCE, {}))
    return {
        DEAD_LETTER_FILES: sorted(previous.extra.get(DEAD_LETTER_FILES, []) + new.extra.get(DEAD_LETTER_FILES, []),
                                  key=lambda r: r["path"]),
        DOC_ID_INDEXES: previous.extra.get(DOC_ID_INDEXES, []) + new.extra.get(DOC_ID_INDEXES, []),
        DUPLICATES_BY_SOURCE: dict(sorted(duplicates.items())),
    }


def committed_id_indexes(previous: Optional[Manifest], output_dir: str) -> tuple:
    """Locations of every committed generation's id index, for an incremental run's dedup.

    A committed generation without one (written before id indexes existed) cannot be checked, and an
    incremental dataset must equal a full build: that is a configuration error naming the fix."""
    from model_contract.manifest import MANIFEST_NAME  # noqa: PLC0415

    if previous is None:
        return ()
    rows = previous.extra.get(DOC_ID_INDEXES, [])
    held = {r.get("generation") for r in rows}
    missing = sorted({g["name"] for g in incremental.generations_of(previous)} - held)
    if missing:
        from pipeline.config import ConfigError  # noqa: PLC0415

        raise ConfigError(f"--incremental: generation(s) {', '.join(missing)} of {output_dir} have no document id "
                          "index (written by an older pileprep), so new documents cannot be checked against "
                          "them; rebuild the dataset without --incremental once")
    manifest_file = io_utils.join(output_dir, MANIFEST_NAME)
    return tuple(resolve_in_dataset(manifest_file, r["path"]) for r in rows)


def resolve_in_dataset(manifest_file: str, rel: str) -> str:
    """Any manifest-relative path (dead letter, id index) through the one resolver shards use, which refuses
    paths outside the dataset (model_contract)."""
    from model_contract import ShardInfo, resolve_shard_path  # noqa: PLC0415

    return resolve_shard_path(manifest_file, ShardInfo(path=rel, split="", examples=0, tokens=0, padding_tokens=0,
                                                       documents=0, bytes=0, sha256=""))
