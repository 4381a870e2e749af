"""Manifest sections that let readers prove the data and let later runs deduplicate against it.

- `dead_letter_files`: size and sha256 of every dead-letter file (shards carry theirs in `ShardInfo`), so
  `pileprep verify` can check every file a manifest names;
- `doc_id_indexes`: one row per generation — its id index (transforms/shard/doc_ids.py: every document id it holds,
  sorted) with size, sha256 and document count. `--incremental` runs look new documents up there;
- `duplicates_by_source`: exact duplicates removed, counted by the source of the removed copy (the kept copy's
  source is the one in `sources`).

It also holds the dataset's state across generations: the ledger rows (`ledger_rows`, `ledger_of`), the
generation rows (`generations_of`, `referenced_generations`: which directories a commit keeps), and `merge`,
which commits one new generation on top of the previous manifest: it concatenates the lists and sums the
counts. Listing the inputs and diffing them against the ledger is pipeline/ops/incremental.py.
"""
from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from model_contract import MANIFEST_NAME, Manifest
from model_contract.dataset_paths import dataset_relative_path, resolve_dataset_path
from model_contract.manifest_rows import FileDigest, IdIndexRow, LedgerRow
from model_contract.schema import is_generation_name
from pipeline.errors import ConfigError
from pipeline.ops.incremental import InputsChangedError, file_sha256
from pipeline.shard.near_dedup import manifest as near_dedup_manifest
from transforms.shard.records import InputFile
from transforms.io import io_utils
from transforms.shard import corpus_stats

DOC_ID_INDEXES = "doc_id_indexes"  # the JSON key, for error messages naming a row


def integrity_sections(dead_letters: list, output_dir: str, generation: str, shard_results: list,
                       id_index: tuple) -> dict:
    """A one-generation manifest's integrity sections, as `Manifest` fields; hashes the generation's dead letters.
    The near-dedup summary (None without the stage) goes to the manifest's `extra`
    (pipeline/shard/near_dedup/manifest.py)."""
    files = []
    for rel in dead_letters:
        size, sha = file_sha256(io_utils.join(output_dir, rel))
        files.append(FileDigest(rel, size, sha))
    path, documents, size, sha = id_index
    duplicates: collections.Counter = collections.Counter()
    for r in shard_results:
        duplicates.update(r.duplicates_per_source)
    summary, band_indexes = near_dedup_manifest.manifest_section(shard_results, output_dir, generation)
    return {"dead_letter_files": files,
            "doc_id_indexes": [IdIndexRow(generation, dataset_relative_path(path, output_dir), documents, size, sha)],
            "duplicates_by_source": dict(sorted(duplicates.items())), "band_indexes": band_indexes,
            "near_dedup": summary}


def merge_integrity_sections(previous: Manifest, new: Manifest) -> dict:
    """The sections of the dataset after an incremental commit of `new` on top of `previous`, as `Manifest`
    fields."""
    duplicates: collections.Counter = collections.Counter(previous.duplicates_by_source or {})
    duplicates.update(new.duplicates_by_source or {})
    return {
        "dead_letter_files": sorted((previous.dead_letter_files or []) + (new.dead_letter_files or []),
                                    key=lambda r: r.path),
        "doc_id_indexes": (previous.doc_id_indexes or []) + (new.doc_id_indexes or []),
        "duplicates_by_source": dict(sorted(duplicates.items())),
        "band_indexes": near_dedup_manifest.merge_band_indexes(previous, new),
    }


def committed_id_indexes(previous: Optional[Manifest], output_dir: str) -> tuple:
    """Locations of every committed generation's id index, for an incremental run's dedup.

    A committed generation without one (written before id indexes existed) cannot be checked, and an
    incremental dataset must equal a full build: that is a configuration error naming the fix."""
    if previous is None:
        return ()
    rows = previous.doc_id_indexes or []
    held = {r.generation for r in rows}
    missing = sorted({g["name"] for g in generations_of(previous)} - held)
    if missing:
        raise ConfigError(f"--incremental: generation(s) {', '.join(missing)} of {output_dir} have no document id "
                          "index (written by an older pileprep), so new documents cannot be checked against "
                          "them; rebuild the dataset without --incremental once")
    manifest_file = io_utils.join(output_dir, MANIFEST_NAME)
    return tuple(resolve_dataset_path(manifest_file, r.path, f"{DOC_ID_INDEXES}[{i}].path")
                 for i, r in enumerate(rows))


def ledger_of(manifest: Optional[Manifest]) -> list:
    """The ledger rows of a committed manifest (synthesized from `inputs` for manifests that predate it)."""
    if manifest is None:
        return []
    if manifest.ledger is not None:
        return list(manifest.ledger)
    gen = manifest.generation or ""
    return [LedgerRow(i["path"], i.get("bytes"), gen) for i in manifest.inputs]


def changed_inputs(previous: Optional[Manifest], paths: list, hasher=file_sha256) -> list:
    """Of `paths` (this run's inputs, which the committed ledger holds under the same path and size), those whose
    bytes are not the ones the ledger's sha256 records, as one problem line each; a row without a sha256 (a
    manifest of an older pileprep) cannot be proven and counts as changed. A plain rerun over a committed
    generation of the same name ((path, size) pairs, pipeline/config.py fingerprint) is "nothing to do" only when
    this is empty: an input rewritten in place with the same size (and mtime) is rebuilt, never skipped."""
    rows = {r.path: r for r in ledger_of(previous)}
    checked = [p for p in paths if rows.get(p) is not None and rows[p].sha256]
    with ThreadPoolExecutor(4) as pool:  # hashlib releases the GIL: the reads overlap
        current = dict(zip(checked, pool.map(lambda p: _sha256_or_none(p, hasher), checked)))
    out = []
    for path in paths:
        row = rows.get(path)
        if row is None or not row.sha256:
            out.append(f"{path}: the committed ledger records no sha256 for it")
        elif current[path] != row.sha256:
            out.append(f"{path}: its bytes changed since generation {row.generation} read it (sha256 "
                       f"{str(current[path])[:12]}…, the ledger says {row.sha256[:12]}…)")
    return out


def _sha256_or_none(path: str, hasher) -> Optional[str]:
    try:
        return hasher(path)[1]
    except OSError:
        return None


def generations_of(manifest: Optional[Manifest]) -> list:
    if manifest is None:
        return []
    if manifest.generations:
        return list(manifest.generations)
    gen = manifest.generation
    return [generation_row(gen, manifest.inputs, manifest.shards)] if gen else []


def referenced_generations(manifest: Optional[Manifest]) -> set:
    """Generation directories a manifest's shards and dead letters live in (validated names only: a manifest
    loaded from disk was checked by `Manifest.validate`, and a name of any other form is never returned)."""
    if manifest is None:
        return set()
    names = {g["name"] for g in generations_of(manifest)}
    for rel in [s.path for s in manifest.shards] + list(manifest.dead_letters):
        names.add(rel.split("/", 1)[0])
    return {n for n in names if is_generation_name(n)}


def _sum_into(into: dict, other: dict) -> None:
    for k, v in other.items():
        if isinstance(v, dict):
            _sum_into(into.setdefault(k, {}), v)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            into[k] = into.get(k, 0) + v
        else:
            into[k] = v


def _sorted_nested(d: dict) -> dict:
    return {k: (_sorted_nested(v) if isinstance(v, dict) else v) for k, v in sorted(d.items())}


def ledger_rows(generation: str, rows: list, digests: dict) -> list[LedgerRow]:
    """A one-generation manifest's ledger, sorted by path. `rows`: the listing rows of the files it ingested;
    `digests`: path -> InputFile (transforms/shard/records.py) of what the workers read, with sha256."""
    ledger = []
    for row in rows:
        listed, read = InputFile.from_dict(row), digests.get(row["path"])
        if read is not None and read.bytes != listed.bytes:
            raise InputsChangedError(f"{listed.path}: listed with {listed.bytes} bytes but {read.bytes} bytes were "
                                     "read; the file changed during the run. Re-run once it is stable.")
        entry = LedgerRow(listed.path, listed.bytes, generation, listed.mtime, listed.etag,
                          read.sha256 if read is not None and read.sha256 else None)
        ledger.append(entry)
    return sorted(ledger, key=lambda r: r.path)


def generation_row(name: str, inputs: list, shards: list) -> dict:
    """A generation's row in the manifest's `generations`: its size in inputs, shards, examples, tokens, documents."""
    return {"name": name, "inputs": len(inputs), "shards": len(shards),
            "examples": sum(s.examples for s in shards), "tokens": sum(s.tokens for s in shards),
            "documents": sum(s.documents for s in shards)}


def merge(previous: Manifest, new: Manifest) -> Manifest:
    """The dataset after committing `new` (one generation) on top of `previous` (any number of generations)."""
    splits: dict = {}
    for m in (previous, new):
        _sum_into(splits, m.splits)
    sources: dict = {}
    for m in (previous, new):
        _sum_into(sources, m.sources)
    records: dict = {}
    for m in (previous, new):
        _sum_into(records, m.records)
    shards = list(previous.shards) + list(new.shards)
    examples = sum(s.examples for s in shards)
    padding = sum(s.padding_tokens for s in shards)
    seq_len = new.contract.seq_len
    extra = dict(new.extra)
    if "statistics" in extra:  # the report's distributions cover every generation (transforms/shard/corpus_stats.py)
        extra["statistics"] = corpus_stats.merge_sections(previous.extra.get("statistics"), new.extra["statistics"])
    return Manifest(
        contract=new.contract,
        shards=shards,
        splits=_sorted_nested(splits),
        sources=_sorted_nested(sources),
        padding_fraction=round(padding / (examples * seq_len), 8) if examples else 0.0,
        records=_sorted_nested(records),
        inputs=sorted(list(previous.inputs) + list(new.inputs), key=lambda r: r["path"]),
        dead_letters=sorted(set(previous.dead_letters) | set(new.dead_letters)),
        config=new.config,
        pileprep_version=new.pileprep_version,
        generation=new.generation,
        generations=generations_of(previous) + generations_of(new),
        ledger=sorted(ledger_of(previous) + ledger_of(new), key=lambda r: r.path),
        skipped_inputs=sorted({r["path"]: r for r in previous.skipped_inputs + new.skipped_inputs}.values(),
                              key=lambda r: r["path"]),
        kind=new.kind,
        retrieval=new.retrieval,
        **merge_integrity_sections(previous, new),  # id indexes, dead-letter files, duplicates, band indexes
        extra=extra,
    )
