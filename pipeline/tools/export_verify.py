"""`pileprep verify OUTPUT` for an export (pipeline/tools/export_formats.py): every file its export.json lists is
hashed and compared with the size and sha256 recorded there; a missing, truncated or changed file, a path that
leaves the output or goes through a link, is a mismatch by name. A Parquet export's export.json (pipeline/tools/
export.py) records them too; one made before it did is a mismatch per file (nothing to check it against).
A file export.json does not list, in a directory that holds files it lists (a generation directory), is a mismatch
by name too: readers take more than the listed names (the HF card's `data/train-*`, a Parquet glob, a Megatron
prefix), so an added or left-over file there changes what they read. Only the export's own bookkeeping there is
not (its generation stamp, a split's done marker, a temporary), nor other directories (the previous generation kept
for readers, a user's own). export.json itself is never read through a link (a link there is a mismatch).

OUTPUT is local or an object store's prefix (s3://bucket/prefix, as `pileprep export` writes it): everything is read
through transforms/io/io_utils.py, so an export on S3 is checked as a local one is, object by object (an object
store has no links to refuse). On s3:// one client (io_utils.s3_client, from the filesystem options verify was
given) lists the output once (sizes) and reads each object: Beam's S3 filesystem builds a new client, and loads
botocore's service model again, on every call (~0.2-0.5 s each), more than hashing a small export costs."""
from __future__ import annotations

import functools
import json
import os

from model_contract.hashing import sha256_file, sha256_stream
from pipeline.tools.export_summary import EXPORT_KIND, GENERATION_NAME, GENERATION_STAMP, SUMMARY_NAME, safe_relative
from transforms.io import io_utils


def is_export(path: str) -> bool:
    """OUTPUT holds an export.json and no manifest.json (local or object store)."""
    if io_utils.is_local(path):
        return os.path.isfile(os.path.join(path, SUMMARY_NAME)) and not os.path.exists(os.path.join(path,
                                                                                                    "manifest.json"))
    return _exists(io_utils.join(path, SUMMARY_NAME)) and not _exists(io_utils.join(path, "manifest.json"))


@functools.lru_cache(maxsize=4)
def _s3(options_json: str):
    return io_utils.s3_client(json.loads(options_json))[1]


def _s3_object(path: str):
    """(client, bucket, key) of an s3:// path, the client built once per set of filesystem options."""
    from transforms.io.filesystem_options import filesystem_options  # noqa: PLC0415

    bucket, _, key = path.split("://", 1)[1].partition("/")
    return _s3(json.dumps(filesystem_options(), sort_keys=True, default=str)), bucket, key


def _exists(path: str) -> bool:
    if not path.startswith("s3://"):
        return io_utils.exists(path)
    client, bucket, key = _s3_object(path)
    found = client.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("Contents", [])
    return bool(found) and found[0]["Key"] == key


def _body(path: str):
    """An s3:// object's streaming body; FileNotFoundError when it is gone."""
    import botocore.exceptions  # noqa: PLC0415 - installed with Beam's S3 filesystem

    client, bucket, key = _s3_object(path)
    try:
        return client.get_object(Bucket=bucket, Key=key)["Body"]
    except botocore.exceptions.ClientError as e:
        raise FileNotFoundError(f"{path}: {e}") from None


def _read(path: str) -> bytes:
    return _body(path).read() if path.startswith("s3://") else io_utils.read_bytes(path)


def _hash_remote(path: str) -> tuple:
    return sha256_stream(_body(path)) if path.startswith("s3://") else sha256_file(path, opener=io_utils.open_read)


def _inside(root: str, rel: str) -> bool:
    """No link on the way from root to the file (a link inside the output is never followed)."""
    path = root
    for part in rel.split("/"):
        path = os.path.join(path, part)
        if os.path.islink(path):
            return False
    return True


def _read_summary(summary_path: str, report):
    try:
        return json.loads(_read(summary_path).decode("utf-8"))
    except (OSError, ValueError) as e:  # UnicodeDecodeError is a ValueError
        report.mismatches.append(f"{summary_path}: unreadable export summary: {type(e).__name__}")
        return None


def _listed(output: str) -> dict:
    """An object store's objects under OUTPUT: {path relative to OUTPUT: size}, from one listing."""
    root = io_utils.join(output, "")
    if root.startswith("s3://"):
        client, bucket, prefix = _s3_object(root)
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        return {o["Key"][len(prefix):]: o["Size"] for page in pages for o in page.get("Contents", [])}
    from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415

    found = FileSystems.match([root + "**"])[0].metadata_list
    return {m.path[len(root):]: m.size_in_bytes for m in found if m.path.startswith(root)}


def _missing(output: str, rel: str, listed, report) -> bool:
    """True (and the mismatch recorded) when the file is not there, or (local) is reached through a link."""
    if listed is not None:
        if rel in listed:
            return False
        report.mismatches.append(f"{rel}: missing")
        return True
    if not _inside(output, rel):
        report.mismatches.append(f"{rel}: reached through a link")
        return True
    if not os.path.isfile(os.path.join(output, rel)):
        report.mismatches.append(f"{rel}: missing")
        return True
    return False


def verify_export(output: str, report) -> None:
    """Fill `report` (pipeline/tools/verify_report.py VerifyReport) from OUTPUT's export.json."""
    local = io_utils.is_local(output)
    join = os.path.join if local else io_utils.join
    summary_path = join(output, SUMMARY_NAME)
    if local and os.path.islink(summary_path):
        report.mismatches.append(f"{summary_path}: a symbolic link; verify never reads an export's record through a "
                                 f"link inside its output (it would check another output's)")
        return
    summary = _read_summary(summary_path, report)
    if summary is None:
        return
    if not isinstance(summary, dict) or summary.get("kind") != EXPORT_KIND or not isinstance(summary.get("files"),
                                                                                              list):
        report.mismatches.append(f"{summary_path}: not an export summary (kind, files)")
        return
    generation = summary.get("generation")
    if not (isinstance(generation, str) and GENERATION_NAME.fullmatch(generation)):
        report.mismatches.append(f"{summary_path}: generation is not a name")
        return
    report.notes.append(f"{summary.get('format')} export of generation {generation}")
    listed = None if local else _listed(output)
    _unlisted(output, summary["files"], listed, report)
    for row in summary["files"]:
        rel = row.get("path") if isinstance(row, dict) else None
        if not (isinstance(rel, str) and safe_relative(rel)):
            report.mismatches.append(f"{summary_path}: a file path that leaves the output: {str(rel)[:80]!r}")
            continue
        if _missing(output, rel, listed, report):
            continue
        report.files_checked += 1
        if "sha256" not in row:  # a Parquet export made before its files' digests were recorded (export.py)
            report.mismatches.append(f"{rel}: export.json records no size and sha256 to check it against (an export "
                                     f"made before they were recorded): export it again")
            continue
        path = join(output, rel)
        if listed is not None and listed[rel] != row.get("bytes"):  # a truncated object: no download to say so
            report.bytes_checked += listed[rel]
            report.mismatches.append(f"{rel}: {listed[rel]} bytes, export.json says {row.get('bytes')}")
            continue
        try:
            size, sha = sha256_file(path) if local else _hash_remote(path)
        except FileNotFoundError:  # gone since the listing
            report.mismatches.append(f"{rel}: missing")
            continue
        report.bytes_checked += size
        if size != row.get("bytes"):
            report.mismatches.append(f"{rel}: {size} bytes, export.json says {row.get('bytes')}")
        elif sha != row.get("sha256"):
            report.mismatches.append(f"{rel}: sha256 {sha[:12]} is not export.json's {str(row.get('sha256'))[:12]}")


def _own_bookkeeping(name: str) -> bool:
    """A file an export keeps beside its files that no reader takes: its stamp, a done marker, a temporary."""
    from pipeline.tools.export import _TEMP_PARQUET  # noqa: PLC0415
    from pipeline.tools.export_formats import DONE_MARKER  # noqa: PLC0415

    head, _, tail = DONE_MARKER.partition("{split}")
    return (name == GENERATION_STAMP or name.startswith(head) and name.endswith(tail)
            or bool(_TEMP_PARQUET.fullmatch(name)))


def _unlisted(output: str, rows: list, listed, report) -> None:
    """Mismatches for the files (and links) in a directory holding listed files that export.json does not list."""
    rels = {row.get("path") for row in rows if isinstance(row, dict) and isinstance(row.get("path"), str)}
    tops = sorted({rel.split("/", 1)[0] for rel in rels if "/" in rel and safe_relative(rel)})
    found = []  # (path relative to OUTPUT, is a link)
    if listed is not None:  # an object store: its one listing (no links there)
        found = [(rel, False) for rel in sorted(listed) if rel.split("/", 1)[0] in tops and "/" in rel]
    for top in tops if listed is None else ():
        root = os.path.join(output, top)
        if os.path.islink(root) or not os.path.isdir(root):
            continue  # the listed files' own mismatches say so
        for directory, dirs, names in os.walk(root):  # never enters a linked directory (it is listed in dirs)
            dirs.sort()
            rel_dir = os.path.relpath(directory, output).replace(os.sep, "/")
            found += [(f"{rel_dir}/{d}", True) for d in dirs if os.path.islink(os.path.join(directory, d))]
            found += [(f"{rel_dir}/{n}", os.path.islink(os.path.join(directory, n))) for n in sorted(names)]
    for rel, link in found:
        if rel in rels or not link and _own_bookkeeping(rel.rsplit("/", 1)[-1]):
            continue
        report.mismatches.append(f"{rel}: " + ("a symbolic link in the export's directory, not listed in export.json"
                                               if link else "not listed in export.json (readers may take it)"))
