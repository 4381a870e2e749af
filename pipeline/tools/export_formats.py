"""`pileprep export DIR --format megatron|hf|mds`: a committed dataset for the trainer a team already has.

An export, not a stage of the shard job: the TFRecord shards stay the one thing the shard job writes (their bytes
and the job's resume keys unchanged), and any committed generation can be exported later, again, or to another
format; the cost is one more read of the shards (their checksums verified on the way, model_contract's checked
reader). `pileprep shard --format ...` runs this same export after its commit (pipeline/tools/export_after_shard.py). The writers: pipeline/tools/export_megatron.py (documents, `.bin/.idx`), export_hf.py (Parquet with a
dataset card `datasets` opens), export_mds.py (MosaicML Streaming shards + index.json).

The protocol, shared by every format (pipeline/tools/export.py has the Parquet one and the checks reused here):
- one writer per output (its lock), an output that is new, empty or an earlier export (`check_export_output`);
  a ref in the dataset to the generation read, so no commit or gc removes it meanwhile (`register_export`);
- files go to `<output>/<generation>/`, each written under a temporary name and renamed; a split's files are
  followed by a done marker (their sizes and sha256, and the key: format, writer version, the split's shard
  hashes), so an export killed mid-way reuses the splits whose files still hash to their marker;
- `export.json` (its own manifest: every file's size and sha256, the generation) is published last, whole: it is
  the commit point. The previous generation's directory is kept for readers that opened it; the one before that
  is removed (only a directory an earlier export.json named and that holds the stamp the export wrote when it
  created it, pipeline/tools/export_summary.py: never another path, never a link);
- `pileprep verify OUTPUT` checks every file export.json lists (pipeline/tools/export_verify.py).
An s3:// output (or any object store Beam reaches): each file is written in a local temporary directory first (the
Megatron writer places a document's pieces by offset in its file, which needs a seekable file), hashed there and
uploaded under its final name (an object appears whole when its upload completes, so no temporary name is needed
there); done markers, export.json last (one PUT: the commit point) and the removal of an older generation go
through the store as the shard job's commit does. The output's lock is the store's conditional PUT.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from typing import Callable, Optional

from model_contract.hashing import sha256_file
from model_contract.manifest_rows import ShardInfo
from pipeline.tools.export import (check_export_dataset, check_export_output, committed_manifest, register_export,
                                   remove_abandoned_temporaries, temporary_name)
from pipeline.tools.export_summary import (EXPORT_KIND, GENERATION_NAME, GENERATION_STAMP, SUMMARY_NAME,
                                           check_same_export, read_text, remove_generations, safe_relative,
                                           stamp_generation, stamped_generations, write_marker)

FORMATS = ("megatron", "hf", "mds")
__all__ = ["FORMATS", "export_format"]
DONE_MARKER = ".pileprep-export-{split}.done.json"
KEEP_PREVIOUS = 1


@dataclass
class SplitJob:
    """One split's export: its shards in manifest order, where they are, where its files go."""
    fmt: str
    split: str
    shards: list[ShardInfo]  # the split's, in manifest order
    manifest_file: str
    manifest: object  # model_contract.Manifest
    directory: str  # <output>/<generation>: local, or an object store's prefix
    sources: Optional[object] = None  # export_sources.DocumentSources: --by-source (Megatron)
    staging: Optional[str] = None  # a local temporary directory when `directory` is remote

    def put(self, name: str, fill: Callable[[str], None]) -> dict:
        """Write `name` (relative to the directory) by `fill(temporary path)`, then rename it into place; its row
        for export.json."""
        return self.put_many([name], lambda tmps: fill(tmps[0]))[0]

    def put_many(self, names: list, fill: Callable[[list], None]) -> list:
        """`put` for files one pass writes together (Megatron's per-source `.bin`s): `fill(temporary paths)`; all
        are hashed and renamed once it returns, none when it raises."""
        from transforms.io import io_utils  # noqa: PLC0415

        remote = self.staging is not None
        targets = [io_utils.join(self.directory, name) if remote else os.path.join(self.directory, name)
                   for name in names]
        local = [os.path.join(self.staging, name) for name in names] if remote else targets
        for target in local:
            os.makedirs(os.path.dirname(target), exist_ok=True)
        tmps = [temporary_name(target) for target in local]
        try:
            fill(tmps)
            digests = [sha256_file(tmp) for tmp in tmps]
            for tmp, target in zip(tmps, targets):
                if remote:  # the object appears whole once its upload completes
                    with open(tmp, "rb") as src, io_utils.open_write(target) as dst:
                        shutil.copyfileobj(src, dst, 8 << 20)
                    os.unlink(tmp)
                else:
                    os.replace(tmp, target)
        except BaseException:
            for tmp in tmps:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            raise
        return [{"path": name, "bytes": size, "sha256": sha, "split": self.split}
                for name, (size, sha) in zip(names, digests)]


def _writers() -> dict:
    from pipeline.tools import export_hf, export_mds, export_megatron  # noqa: PLC0415

    return {"megatron": export_megatron, "hf": export_hf, "mds": export_mds}


def export_format(dataset: str, fmt: str, output: Optional[str] = None, splits: Optional[tuple] = None,
                  s3_options: Optional[dict] = None, by_source: bool = False, break_lock: bool = False) -> dict:
    """Write DIR's committed generation in `fmt` under `output` (default DIR/<fmt>); returns export.json's
    content with `output`. `by_source` (Megatron only): one `.bin/.idx` per split and source, and the blend
    (pipeline/tools/export_megatron.py `finish`). `break_lock`: `--break-lock`, as shard's: remove a gone run's
    lock on the output first."""
    from pipeline.errors import ConfigError  # noqa: PLC0415
    from pipeline.ops import lock  # noqa: PLC0415
    from transforms.io import io_utils  # noqa: PLC0415

    if by_source and fmt != "megatron":
        raise ConfigError(f"--by-source: only --format megatron has one file set per source (a blend), not {fmt}")
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: must be one of parquet, {', '.join(FORMATS)}")
    output = output or io_utils.join(dataset, fmt)
    check_export_dataset(dataset)
    check_export_output(output, fmt, by_source, dataset)
    with lock.OutputLock(output, s3_options).held(break_lock):
        if io_utils.is_local(output):
            remove_abandoned_temporaries(output)
            return _export(dataset, fmt, output, splits, by_source)
        import tempfile  # noqa: PLC0415

        staging = tempfile.mkdtemp(prefix="pileprep-export-")
        try:
            return _export(dataset, fmt, output, splits, by_source, staging)
        finally:
            shutil.rmtree(staging, ignore_errors=True)


def _split_key(fmt: str, writer, shards: list, by_source: bool = False) -> str:
    key = {"format": fmt, "writer": writer.VERSION, "shards": [(s.path, s.sha256) for s in shards]}
    if by_source:  # absent otherwise: the key of an export made before the option stays
        key["by_source"] = True
    blob = json.dumps(key)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _reusable(directory: str, split: str, key: str) -> Optional[list]:
    """The split's rows from its done marker when the key is this export's and every file still hashes to it."""
    from transforms.io import io_utils  # noqa: PLC0415

    remote = not io_utils.is_local(directory)
    path = (io_utils.join if remote else os.path.join)(directory, DONE_MARKER.format(split=split))
    try:
        marker = json.loads(read_text(path))
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("key") != key or not isinstance(marker.get("files"), list):
        return None
    rows = marker["files"]
    for row in rows:
        if not (isinstance(row, dict) and isinstance(row.get("path"), str) and safe_relative(row["path"])):
            return None
        if remote:
            target = io_utils.join(directory, row["path"])
            if not io_utils.exists(target):
                return None
            digest = sha256_file(target, opener=io_utils.open_read)
        else:
            target = os.path.join(directory, row["path"])
            if os.path.islink(target) or not os.path.isfile(target):
                return None
            digest = sha256_file(target)
        if digest != (row.get("bytes"), row.get("sha256")):
            return None
    return rows


def _export(dataset: str, fmt: str, output: str, splits: Optional[tuple], by_source: bool = False,
            staging: Optional[str] = None) -> dict:
    """`staging`: a local temporary directory when `output` is remote (module doc)."""
    from pipeline.ops import commit  # noqa: PLC0415
    from transforms.io import io_utils  # noqa: PLC0415

    # Every refusal before the ref and the first file: a refused export leaves the dataset and the output as they were.
    previous = check_same_export(output, fmt, by_source)  # again under the lock: another export may have committed
    planned = committed_manifest(dataset)
    directory, sources = _plan(planned, output, manifest_file=commit.manifest_location(dataset), staging=staging,
                               by_source=by_source)
    manifest = register_export(dataset, output)
    if manifest.generation != planned.generation:  # committed meanwhile: the plan is of the generation exported
        directory, sources = _plan(manifest, output, commit.manifest_location(dataset), staging, by_source)
    manifest_file = commit.manifest_location(dataset)
    generation = manifest.generation or "current"
    writer = _writers()[fmt]
    local = staging is None
    marker = None
    if local and previous is None:
        os.makedirs(output, exist_ok=True)
        marker = write_marker(output, fmt, by_source)
    if local and not os.path.isdir(directory):
        os.makedirs(directory)
        stamp_generation(directory)  # this export made it: a later export may remove it (export_summary.py)
    elif not local and not io_utils.exists(io_utils.join(directory, GENERATION_STAMP)):
        stamp_generation(directory)  # an object store's prefix named by the generation: the export's own
    files, info = [], {}
    chosen = [s for s in manifest.splits if not splits or s in splits]  # the manifest's split order
    for split in chosen:
        shards = [s for s in manifest.shards if s.split == split]
        key = _split_key(fmt, writer, shards, by_source)
        rows = _reusable(directory, split, key)
        if rows is None:
            job = SplitJob(fmt, split, shards, manifest_file, manifest, directory, sources, staging)
            rows = writer.write_split(job)
            done = {"key": key, "files": rows}
            job.put(DONE_MARKER.format(split=split), lambda p: _write_json(p, done))
        files += [{**r, "path": f"{generation}/{r['path']}"} for r in rows]
    extra = writer.finish(SplitJob(fmt, "", [], manifest_file, manifest, directory, sources, staging), chosen, files)
    for row in extra:
        files.append({**row, "path": f"{generation}/{row['path']}"})
    info = getattr(writer, "describe", lambda m, f: {})(manifest, files)
    kept = _kept_generations(previous, generation)
    summary = {"kind": EXPORT_KIND, "format": fmt, "generation": generation, "files": files, "previous": kept,
               **info, **({"by_source": True} if by_source else {})}
    _publish(io_utils.join(output, SUMMARY_NAME) if not local else os.path.join(output, SUMMARY_NAME), summary)
    done = [DONE_MARKER.format(split=split) for split in chosen]  # the commit is made: not needed any more
    if local:
        for name in done:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
    else:
        from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415

        FileSystems.delete([io_utils.join(directory, name) for name in done])
    _remove_older(output, previous, kept, generation)
    if marker is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(marker)
    return {"output": output, **summary}


def _plan(manifest, output: str, manifest_file: str, staging: Optional[str], by_source: bool) -> tuple:
    """(the generation's directory, the documents' sources or None); ConfigError for what an export refuses."""
    from pipeline.errors import ConfigError  # noqa: PLC0415
    from transforms.io import io_utils  # noqa: PLC0415

    generation = manifest.generation or "current"
    if not GENERATION_NAME.fullmatch(generation):
        raise ConfigError(f"{manifest_file}: generation {generation[:40]!r} is not a name an export can use")
    local = staging is None
    directory = os.path.join(output, generation) if local else io_utils.join(output, generation)
    if local and (os.path.islink(directory) or (os.path.exists(directory) and not os.path.isdir(directory))):
        raise ConfigError(f"{directory}: not a directory this export made (a link or a file): choose another --output")
    if not by_source:
        return directory, None
    from pipeline.tools.export_sources import SourceError, document_sources  # noqa: PLC0415

    try:  # before any file: a changed or missing input is refused with nothing written
        return directory, document_sources(manifest)
    except SourceError as e:
        raise ConfigError(f"--by-source: {e}") from None


def _write_json(path: str, value) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(value, indent=1, sort_keys=True) + "\n")


def _publish(path: str, summary: dict) -> None:
    from transforms.io import io_utils  # noqa: PLC0415

    io_utils.publish_bytes(path, (json.dumps(summary, indent=1, sort_keys=True) + "\n").encode("utf-8"))


def _kept_generations(previous: Optional[dict], generation: str) -> list:
    """The generations kept beside this one: the one the earlier export.json committed (a reader may hold it)."""
    if not previous:
        return []  # names checked by export_summary.py read_summary
    names = [previous.get("generation")] + list(previous.get("previous") or [])
    names = [n for n in names if isinstance(n, str) and GENERATION_NAME.fullmatch(n) and n != generation]
    return names[:KEEP_PREVIOUS]


def _remove_older(output: str, previous: Optional[dict], kept: list, generation: str) -> None:
    """Remove the generation directories an earlier export.json named and that are no longer kept
    (export_summary.py `remove_generations`: only those an export created, never a link or another path), and
    those a killed export created that no export.json ever named (`stamped_generations`)."""
    named = [previous.get("generation")] + list(previous.get("previous") or []) if previous else []
    remove_generations(output, named + stamped_generations(output), [*kept, generation])
