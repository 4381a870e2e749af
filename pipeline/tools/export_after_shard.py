"""`pileprep shard ... --format tfrecord,megatron,hf,mds,parquet`: the other formats of the same job, as exports.

The TFRecord shards are always written: they are the source of truth every other format is read from (their bytes,
manifest, config fingerprint and generation name are those of a run without --format: the flag is not a
ShardConfig field, so the serialized config does not see it). Once the shard job has committed (or found nothing
to do), each other format is `pileprep export OUTPUT --format F` of the committed generation into OUTPUT/F/, by the
same code (pipeline/tools/export_formats.py, export.py for Parquet): the files are the ones shard-then-export
writes, export.json is their manifest (`pileprep verify OUTPUT/F`), and a run killed during an export resumes from
that export's done markers when the same command runs again (the shard job then has nothing to do).

The values: space separated after one --format (as --inputs takes several), comma separated, or --format repeated;
any mix. Order and repeats do not matter: the exports run in FORMATS order."""
from __future__ import annotations

from typing import Optional

FORMATS = ("tfrecord", "megatron", "hf", "mds", "parquet")  # tfrecord first: the shard job itself
DEFAULT = ("tfrecord",)


def parse_formats(values: Optional[list]) -> tuple:
    """The formats `--format` names (list of flag values, each may hold commas; None: the default), in FORMATS
    order, tfrecord always first. UsageError (exit 2, one line) for an unknown or empty value."""
    from pipeline.errors import UsageError  # noqa: PLC0415
    from pipeline.options import did_you_mean  # noqa: PLC0415

    named = set()
    for value in values or DEFAULT:
        for name in str(value).split(","):
            name = name.strip()
            if name not in FORMATS:
                shown = repr(name) if name else "an empty value"
                hint = did_you_mean(name, FORMATS) if name else ""
                raise UsageError(f"shard: --format {shown}{hint}: choose from {', '.join(FORMATS)} (comma separated "
                                 f"or repeated; tfrecord is always written)")
            named.add(name)
    return tuple(f for f in FORMATS if f == "tfrecord" or f in named)


def export_committed(output: str, formats: tuple, s3_options: Optional[dict] = None,
                     break_lock: bool = False) -> list:
    """Export OUTPUT's committed generation in each of `formats` but tfrecord into OUTPUT/<format>/ (the default
    output of `pileprep export`); one line per export for the user. `break_lock`: shard's --break-lock, which the
    exports' lock message names, is theirs too."""
    from pipeline.tools.export import export_parquet  # noqa: PLC0415
    from pipeline.tools.export_formats import export_format  # noqa: PLC0415

    lines = []
    for fmt in formats:
        if fmt == "tfrecord":
            continue
        if fmt == "parquet":
            summary = export_parquet(output, None, s3_options=s3_options, break_lock=break_lock)
        else:
            summary = export_format(output, fmt, None, s3_options=s3_options, break_lock=break_lock)
        lines.append(f"pileprep: --format {fmt}: {len(summary['files'])} files of generation "
                     f"{summary['generation']} in {summary['output']} (export.json; pileprep verify checks them)")
    return lines
