"""`pileprep export DIR --format parquet`: the shards as Parquet, for HF `datasets`, pandas, DuckDB, Spark.

One Parquet file per shard, at the shard's own relative path with `.parquet` for `.tfrecord`
(`<out>/gen-…/<split>-00000-of-00004.parquet`: an incremental dataset has one generation directory per run and
the same shard basenames in each, see pipeline/ops/output_names.py), one row per packed example, in shard order:

  input_ids, segment_ids, positions   list<int32>  the example's seq_len tokens, exactly as in the TFRecord
  piece_doc_ids, piece_offsets        list<int64>  per document piece: the document id and its token offset
  split, shard, record                provenance: the split, the shard's manifest path, the record's index

Shards are read through model_contract's checked reader (checksums verified; a file whose size or record count is
not its manifest entry's is refused by name before its Parquet file is renamed into place) and written in row groups of
`rows_per_group` examples, so memory stays at one row group whatever the shard size. Files are written under a
temporary name and renamed (local) or put whole (object stores); an `export.json` beside them lists the files
and the manifest generation they came from. An export holds its output's lock (pipeline/ops/lock.py; an object
store's too) and first removes the temporaries an interrupted export left there. Before reading, the export registers a ref to that generation in
the dataset (`.refs/export-….json`, pipeline/ops/generations.py), so no later commit or gc removes the files it
was made from while the export exists.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import uuid
from typing import Optional

import numpy as np

from model_contract import (INPUT_IDS, PIECE_DOC_IDS, PIECE_OFFSETS, POSITIONS, SEGMENT_IDS, decode_example,
                            resolve_shard_path)
from model_contract.checked_reader import iter_checked_records
from pipeline.ops.output_names import check_unique, derived_path
from model_contract.hashing import sha256_file
from pipeline.tools.export_summary import (EXPORT_KIND, GENERATION_NAME, GENERATION_STAMP, IN_PROGRESS_MARKER,
                                           SUMMARY_NAME, check_same_export, remove_generations, stamp_generation,
                                           stamped_generations, write_marker)

ROWS_PER_GROUP = 1024
TOKEN_COLUMNS = (INPUT_IDS, SEGMENT_IDS, POSITIONS)
PIECE_COLUMNS = (PIECE_DOC_IDS, PIECE_OFFSETS)
FORMATS = ("parquet",)
# The temporary form of a Parquet file being written: `.<name>.parquet.<12 hex>.tmp` beside its final name (unique
# per writer, hidden, as transforms/io/io_utils.py `replace_atomically` names its own). An export killed mid-write
# leaves one; the next export removes exactly these (and the fixed `<split>-NNNNN-of-NNNNN.parquet.tmp` that
# exports before this naming used), never another file: `remove_abandoned_temporaries`.
# The other formats' writers (pipeline/tools/export_formats.py) name theirs the same way (`.bin`, `.idx`, `.mds`, ...).
_TEMP_PARQUET = re.compile(r"\.[^/]+\.[a-z]+\.[0-9a-f]{12}\.tmp|[a-z]+-[0-9]{5}-of-[0-9]{5}\.parquet\.tmp")


def temporary_name(target: str) -> str:
    head, base = os.path.split(target)
    return os.path.join(head, f".{base}.{uuid.uuid4().hex[:12]}.tmp")


def remove_abandoned_temporaries(output: str) -> list:
    """Remove the Parquet temporaries an interrupted export left under local `output` (regular files whose names
    have the export's temporary form, at any depth: the files sit at their shards' relative paths). Call only while
    holding the output's lock (pipeline/ops/lock.py), as pipeline/ops/guards.py `cleanup_abandoned` removes a
    crashed shard run's leftovers: no other export is writing then. Returns the removed paths."""
    removed = []
    for directory, dirs, names in os.walk(output):  # never follows a symlinked directory
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(directory, name)
            if _TEMP_PARQUET.fullmatch(name) and os.path.isfile(path) and not os.path.islink(path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                removed.append(path)
    return removed


def check_export_output(output: str, fmt: str = "parquet", by_source: bool = False,
                        dataset: Optional[str] = None) -> None:
    """ConfigError (exit 2) unless `output` is new, empty or an earlier export of `fmt` (it holds an export.json
    of that format, pipeline/tools/export_summary.py `check_same_export`): an export written into a dataset, a
    retrieval store or a sidecar would put its files among theirs (and its export.json beside their manifest), one
    written into a directory of the user's files would replace any of the same name, and one written over another
    format's export would replace its record. The rule of pipeline/ops/commit.py `check_output_kind`, for a
    command that writes no manifest."""
    from pipeline.errors import ConfigError  # noqa: PLC0415
    from pipeline.ops import commit  # noqa: PLC0415
    from transforms.io import io_utils  # noqa: PLC0415

    if dataset is not None:
        check_output_beside_dataset(dataset, output)
    if io_utils.is_local(output):
        parent = os.path.dirname(os.path.realpath(output))  # the directory written, a link as --output too
        while True:
            if os.path.isfile(os.path.join(parent, GENERATION_STAMP)):  # that export removes it when it moves on
                raise ConfigError(f"--output {output}: it lies inside {parent}, a generation directory of another "
                                  f"export (removed with what is inside it once that export moves on): choose "
                                  f"another --output")
            if parent == os.path.dirname(parent):
                break
            parent = os.path.dirname(parent)
    found = commit.committed_kind(output)
    if found is not None:
        raise ConfigError(f"--output {output}: it holds a {found} (manifest.json); an export is never written into "
                          f"another kind of output: choose another --output")
    if (io_utils.is_local(output) and os.path.isdir(output)
            and not any(os.path.exists(os.path.join(output, name)) for name in (SUMMARY_NAME, IN_PROGRESS_MARKER))):
        from pipeline.ops.lock import LOCK_NAME  # noqa: PLC0415

        entries = sorted(e for e in os.listdir(output) if e != LOCK_NAME)  # a live or crashed export's lock
        if entries:
            shown = ", ".join(entries[:3]) + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")
            raise ConfigError(f"--output {output}: it holds files pileprep did not create ({shown}); an export is "
                              f"written only into a new or empty directory or over an earlier export: choose "
                              f"another --output")
    elif io_utils.is_local(output) and os.path.exists(output) and not os.path.isdir(output):
        raise ConfigError(f"--output {output}: it is a file, not a directory: choose another --output")
    check_same_export(output, fmt, by_source)


def check_output_beside_dataset(dataset: str, output: str) -> None:
    """ConfigError (exit 2) when `output` lies inside one of DATASET's own directories (a generation directory,
    generations/, .refs/, _staging/): the export's files would sit among the dataset's, and gc removes a generation
    directory, with an export inside it, once no ref names that generation (a re-export moves the export's ref to
    the newer one). Inside the dataset an export has a directory of its own (DATASET/<format>, the default); the
    names are pipeline/ops/commit.py `check_staging_dir`'s, refused there for --staging-dir for the same reason."""
    from model_contract import MANIFEST_NAME  # noqa: PLC0415
    from model_contract import refs  # noqa: PLC0415
    from pipeline.errors import ConfigError  # noqa: PLC0415
    from pipeline.ops import guards  # noqa: PLC0415

    root, out = guards.normal_path(dataset).rstrip("/"), guards.normal_path(output)
    if not out.startswith(root + "/"):
        return
    head = out[len(root) + 1:].split("/", 1)[0]
    if head.startswith("gen-") or head in (MANIFEST_NAME, refs.GENERATIONS_DIR, refs.REFS_DIR,
                                           guards.DEFAULT_STAGING_NAME):
        raise ConfigError(f"--output {output}: it lies inside the dataset's {head} (the dataset's own files; gc "
                          f"removes a generation with what is inside it): choose another --output (by default "
                          f"DATASET/<format>, beside them)")


def parquet_schema():
    import pyarrow as pa  # noqa: PLC0415

    return pa.schema([(name, pa.list_(pa.int32())) for name in TOKEN_COLUMNS]
                     + [(name, pa.list_(pa.int64())) for name in PIECE_COLUMNS]
                     + [("split", pa.string()), ("shard", pa.string()), ("record", pa.int64())])


def _list_column(arrays: list, dtype):
    import pyarrow as pa  # noqa: PLC0415

    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum([a.size for a in arrays], out=offsets[1:])
    values = np.concatenate(arrays).astype(dtype) if arrays else np.zeros(0, dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def examples_to_table(examples: list, split: str, shard: str, first_record: int):
    """A pyarrow Table of decoded examples (dicts of numpy arrays), with provenance columns."""
    import pyarrow as pa  # noqa: PLC0415

    columns = [_list_column([e[name] for e in examples], np.int32) for name in TOKEN_COLUMNS]
    columns += [_list_column([e[name] for e in examples], np.int64) for name in PIECE_COLUMNS]
    n = len(examples)
    columns += [pa.array([split] * n, pa.string()), pa.array([shard] * n, pa.string()),
                pa.array(np.arange(first_record, first_record + n, dtype=np.int64))]
    return pa.Table.from_arrays(columns, schema=parquet_schema())


def _export_shard(stream, out_stream, shard, rows_per_group: int) -> int:
    import pyarrow.parquet as pq  # noqa: PLC0415

    split, shard_path = shard.split, shard.path
    rows = 0
    with pq.ParquetWriter(out_stream, parquet_schema(), compression="zstd") as writer:
        batch: list = []
        for record in iter_checked_records(stream, shard):
            batch.append(decode_example(record))
            if len(batch) == rows_per_group:
                writer.write_table(examples_to_table(batch, split, shard_path, rows), row_group_size=rows_per_group)
                rows += len(batch)
                batch = []
        if batch or rows == 0:
            writer.write_table(examples_to_table(batch, split, shard_path, rows), row_group_size=rows_per_group)
            rows += len(batch)
    return rows


def export_parquet(dataset: str, output: Optional[str] = None, rows_per_group: int = ROWS_PER_GROUP,
                   splits: Optional[tuple] = None, s3_options: Optional[dict] = None, break_lock: bool = False) -> dict:
    """Write every shard of DIR's committed manifest as Parquet under `output` (default DIR/parquet).
    `s3_options`: Beam's s3_* options (pipeline/beam_glue.py `s3_options_of`) for the lock on an s3:// output.
    `break_lock`: `--break-lock`, as shard's: remove a gone run's lock on the output first."""
    from pipeline.ops import lock  # noqa: PLC0415
    from transforms.io import io_utils  # noqa: PLC0415

    check_export_dataset(dataset)
    output = output or io_utils.join(dataset, "parquet")
    check_export_output(output, dataset=dataset)  # before the ref: a refused export leaves nothing in the dataset
    # One writer per output (pipeline/ops/lock.py), local or object store alike (the lock object is a conditional
    # PUT there, as the shard job's): two exports into one output wrote the same files, and export.json named one
    # run's files over the other's.
    with lock.OutputLock(output, s3_options).held(break_lock):
        previous = check_same_export(output, "parquet")  # again under the lock: another may have committed since
        if io_utils.is_local(output):
            remove_abandoned_temporaries(output)  # an interrupted export's, under the lock
        return _export(dataset, output, rows_per_group, splits, previous)


def _export(dataset: str, output: str, rows_per_group: int, splits: Optional[tuple],
            previous: Optional[dict] = None) -> dict:
    from pipeline.ops import commit  # noqa: PLC0415
    from transforms.io import io_utils  # noqa: PLC0415

    _planned(output, committed_manifest(dataset), splits)  # refused before the ref: a refused export leaves nothing
    manifest = register_export(dataset, output)
    manifest_file = commit.manifest_location(dataset)
    files = []
    chosen, names = _planned(output, manifest, splits)
    summary_path = io_utils.join(output, SUMMARY_NAME)
    marker = os.path.join(output, IN_PROGRESS_MARKER) if io_utils.is_local(output) else None
    if marker is not None and not os.path.exists(summary_path):
        write_marker(output, "parquet")
    tops = _stamp_directories(output, names)
    for shard, name in zip(chosen, names):
        target = io_utils.join(output, name)
        local = io_utils.is_local(target)
        tmp = temporary_name(target) if local else target
        if local:
            os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        try:
            with io_utils.open_read(resolve_shard_path(manifest_file, shard)) as src, io_utils.open_write(tmp) as dst:
                rows = _export_shard(src, dst, shard, rows_per_group)  # raises before the rename on a mismatch
        except BaseException:
            if local:  # this run's own temporary; one a kill leaves is removed by the next export
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            raise
        # Each file's size and sha256, as the other formats record theirs: `pileprep verify` hashes it again.
        size, sha = sha256_file(tmp) if local else sha256_file(target, opener=io_utils.open_read)
        if local:
            os.replace(tmp, target)
        files.append({"path": name, "split": shard.split, "rows": rows, "source_shard": shard.path, "bytes": size,
                      "sha256": sha})
    # The directories of the export before this one that this one does not use: kept for its readers, named in
    # `previous`; the ones that export kept are removed once this export.json is published (as the other formats'
    # generations, export_formats.py; only directories an export created and stamped).
    earlier = sorted({f["path"].split("/", 1)[0] for f in (previous or {}).get("files", []) if "/" in f["path"]})
    kept = [d for d in earlier if d not in tops and GENERATION_NAME.fullmatch(d)]
    summary = {"kind": EXPORT_KIND, "format": "parquet", "generation": manifest.generation, "files": files,
               "columns": [f.name for f in parquet_schema()], "previous": kept}
    # Published whole (an atomic replace locally, one PUT on object stores): a kill while writing it leaves the
    # earlier export.json or none, never a part.
    io_utils.publish_bytes(summary_path, (json.dumps(summary, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    named = list((previous or {}).get("previous") or [])
    remove_generations(output, named + stamped_generations(output), [*kept, *tops])
    if marker is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker)
    return {"output": output, **summary}


def _stamp_directories(output: str, names: list) -> list:
    """The top directories of the export's files (the shards' generation directories), each stamped as the
    export's own when this export creates it (export_summary.py `stamp_generation`): only such a directory is
    ever removed by a later export."""
    from transforms.io import io_utils  # noqa: PLC0415

    tops = sorted({name.split("/", 1)[0] for name in names if "/" in name})
    for top in tops:
        directory = io_utils.join(output, top)
        if io_utils.is_local(directory) and not os.path.isdir(directory):
            os.makedirs(directory)
            stamp_generation(directory)
        elif not io_utils.is_local(directory) and not io_utils.exists(io_utils.join(directory, GENERATION_STAMP)):
            stamp_generation(directory)  # an object store's prefix: the export's own
    return tops


def _planned(output: str, manifest, splits: Optional[tuple]) -> tuple:
    """(the shards to export, their Parquet names); ConfigError for names that collide or a link on the way."""
    from transforms.io import io_utils  # noqa: PLC0415

    chosen = [s for s in manifest.shards if not splits or s.split in splits]
    names = [derived_path(s.path, suffix=".parquet") for s in chosen]
    check_unique(zip((s.path for s in chosen), names))  # before writing anything
    from pipeline.errors import ConfigError  # noqa: PLC0415

    for name in names:  # an earlier export's directory replaced by a link: never write (replace) through it
        links = io_utils.links_below(output, os.path.dirname(io_utils.join(output, name)))
        if links:
            raise ConfigError(f"--output {output}: {links[0]} is a symbolic link; an export never writes through a "
                              f"link inside its output (it would replace files elsewhere): remove it or choose "
                              f"another --output")
        parent = os.path.dirname(io_utils.join(output, name))
        while io_utils.is_local(parent) and parent.rstrip("/") != output.rstrip("/") and len(parent) > len(output):
            if os.path.lexists(parent) and not os.path.isdir(parent):  # as export_formats.py `_plan` refuses it
                raise ConfigError(f"{parent}: not a directory this export made (a file): choose another --output")
            parent = os.path.dirname(parent)
    return chosen, names


def committed_manifest(dataset: str):
    """The dataset's committed manifest (read before the export's ref, to refuse with nothing written)."""
    from pipeline.ops import commit  # noqa: PLC0415

    manifest = commit.read_committed(dataset)
    if manifest is None:
        raise _no_manifest(dataset)
    return commit.require_dataset(manifest, dataset)


def _no_manifest(dataset: str) -> FileNotFoundError:
    from pipeline.ops import commit  # noqa: PLC0415

    return FileNotFoundError(f"no manifest at {commit.manifest_location(dataset)}: the dataset is missing or was "
                             f"never committed")


def check_export_dataset(dataset: str) -> None:
    """FileNotFoundError (exit 2) when DATASET holds no manifest. Checked before the output's lock, which creates
    the output directory (by default DATASET/<format>, so DATASET too): a refused export creates nothing."""
    from pipeline.ops import commit  # noqa: PLC0415
    from transforms.io import io_utils  # noqa: PLC0415

    if not io_utils.exists(commit.manifest_location(dataset)):
        raise _no_manifest(dataset)


DATASET_LOCK_WAIT_S = 10.0  # register_export: how long an export waits for the dataset's lock before it is refused


def register_export(dataset: str, output: str):
    """Under the dataset's lock (local datasets): the live manifest, and `output`'s ref to its generation
    (replacing an earlier export's ref to the same output). A dataset this user cannot write still exports,
    with a warning."""
    import logging  # noqa: PLC0415
    import time  # noqa: PLC0415

    from model_contract.refs import Ref  # noqa: PLC0415
    from pipeline.ops import commit, generations, lock  # noqa: PLC0415
    from transforms.io import io_utils  # noqa: PLC0415

    if not io_utils.exists(commit.manifest_location(dataset)):
        return committed_manifest(dataset)  # before taking a lock, which would create the directory
    holder = os.path.abspath(output) if io_utils.is_local(output) else output

    def register():
        manifest = committed_manifest(dataset)
        if manifest.generation:
            generations.write_ref(dataset, Ref(manifest.generation, "export", holder, round(time.time(), 3)))
        return manifest

    try:
        if not io_utils.is_local(dataset):
            # The lock on S3 needs the store's credentials as the shard job gets them; the ref's one PUT and the
            # generation read again after it are enough (model_contract/refs.py: pinning).
            manifest = register()
            if commit.committed_generation_of(dataset) != manifest.generation:
                manifest = register()
            return manifest
        # A shard or gc run holds the dataset's lock; export's --break-lock is its output's (as shard's and gc's
        # are theirs), so the remedy named for a gone holder is gc's, which takes the dataset's lock and nothing else.
        remedy = f"run `pileprep gc {dataset} --break-lock` (a dry run that removes the gone run's lock)"
        # Another export holds it for the milliseconds its own ref takes (exports of one dataset started together
        # refused each other): wait a bounded while; a holder that keeps it (a shard or gc run) is still refused.
        deadline = time.monotonic() + DATASET_LOCK_WAIT_S
        while True:
            try:
                with lock.OutputLock(dataset, remedy=remedy).held():
                    return register()
            except lock.OutputLockedError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
    except PermissionError as e:
        logging.getLogger("pileprep.export").warning(
            "%s: cannot register this export's ref (%s): a later commit or gc may remove the generation it reads",
            dataset, type(e).__name__)
        return committed_manifest(dataset)
