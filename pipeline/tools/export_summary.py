"""An export's own record in its output (`export.json`), read and checked before an export writes there.

Every export (pipeline/tools/export.py for Parquet, pipeline/tools/export_formats.py for Megatron, HF, MDS) reads
an existing output's export.json before it takes the output's lock, and again under it. What it reads decides what
it replaces and what it removes (the generation directories `previous` names), so nothing there is trusted:

- a file that is not JSON, or not an export's record (kind, format, generation, files, previous), is refused by
  name, exit 2, one line: it is not a file this command wrote (a user's own `export.json`, a damaged one), and an
  export never replaces what it did not write;
- an export of another format (or --by-source where the record has none, or the reverse) is refused: one output
  holds one export, each format's default output is its own directory (DATASET/<format>, README "Export");
- a generation name must be a plain name (no `/`, no `..`, no leading dot), and a generation directory is removed
  only when it is a real directory (not a link) holding the stamp file the export wrote when it created it
  (`GENERATION_STAMP`): a `previous` naming a user's directory inside the output keeps that directory.
"""
from __future__ import annotations

import json
import os
import re
from typing import Optional

SUMMARY_NAME = "export.json"
EXPORT_KIND = "export"  # export.json's `kind`, as a committed manifest's (pipeline/ops/commit.py KINDS)
EXPORT_FORMATS = ("parquet", "megatron", "hf", "mds")
# Written before the first file of an export into an output that has no export.json yet, removed once export.json
# is written: an export killed before its export.json leaves an output the next export recognises as its own
# (export.py check_export_output), not as "files pileprep did not create". It holds the export's format (and
# `--by-source` after it when given), so a killed export of one format is not taken over by another, nor a killed
# export with --by-source by one without it (or the reverse).
IN_PROGRESS_MARKER = ".pileprep-export-in-progress"
# Written into each generation directory an export creates (export_formats.py): the proof that a directory a
# later export.json names under `previous` is the export's own, before that directory is removed.
GENERATION_STAMP = ".pileprep-generation"
GENERATION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _config_error(message: str):
    from pipeline.errors import ConfigError  # noqa: PLC0415

    return ConfigError(message)


def safe_relative(path: str) -> bool:
    """A relative path inside its directory: no absolute path, no `..`, no empty or hidden-trick parts."""
    parts = path.split("/")
    return (bool(path) and not path.startswith("/") and "\\" not in path
            and all(p not in ("", ".", "..") for p in parts))


def read_text(path: str) -> str:
    """A local or object-store file's text; FileNotFoundError (an OSError) when it is not there."""
    from transforms.io import io_utils  # noqa: PLC0415

    if io_utils.is_local(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    if not io_utils.exists(path):
        raise FileNotFoundError(path)
    return io_utils.read_bytes(path).decode("utf-8")


def _join(output: str, name: str) -> str:
    from transforms.io import io_utils  # noqa: PLC0415

    return os.path.join(output, name) if io_utils.is_local(output) else io_utils.join(output, name)


def summary_problem(summary) -> Optional[str]:
    """What makes `summary` (parsed JSON) not an export's record, or None."""
    if not isinstance(summary, dict) or summary.get("kind") != EXPORT_KIND:
        return f'not an export\'s record (no "kind": "{EXPORT_KIND}")'
    fmt = summary.get("format")
    if fmt not in EXPORT_FORMATS:
        return f"format {str(fmt)[:20]!r} is not one of {', '.join(EXPORT_FORMATS)}"
    generation = summary.get("generation")
    if not (isinstance(generation, str) and GENERATION_NAME.fullmatch(generation)
            or fmt == "parquet" and generation is None):  # a Parquet export of a dataset without generations
        return f"generation {str(generation)[:40]!r} is not a generation name"
    previous = summary.get("previous", [])
    if not (isinstance(previous, list) and all(isinstance(p, str) and GENERATION_NAME.fullmatch(p)
                                               for p in previous)):
        return f"previous {json.dumps(previous, default=str)[:60]} is not a list of generation names"
    files = summary.get("files")
    if not isinstance(files, list):
        return "files is not a list"
    for row in files:
        rel = row.get("path") if isinstance(row, dict) else None
        if not (isinstance(rel, str) and safe_relative(rel)):
            return f"a file path that leaves the output: {str(rel)[:80]!r}"
    if not isinstance(summary.get("by_source", False), bool):
        return "by_source is not true or false"
    return None


def read_summary(output: str) -> Optional[dict]:
    """OUTPUT's export.json, checked (module doc); None when there is none. ConfigError (exit 2, one line naming
    the file and the problem) when it cannot be read or is not an export's record."""
    path = _join(output, SUMMARY_NAME)
    try:
        summary = json.loads(read_text(path))
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        problem = "a directory, not an export's record"
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        problem = f"not readable JSON ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})"
    else:
        problem = summary_problem(summary)
        if problem is None:
            return summary
    raise _config_error(f"{path}: {problem}; an export never replaces a file it did not write: move it away or "
                        f"choose another --output")


def check_same_export(output: str, fmt: str, by_source: bool = False) -> Optional[dict]:
    """OUTPUT's checked export.json (None when none) when an export of `fmt` (with or without --by-source) may
    write there; ConfigError when it holds another export, or a killed export of another format (module doc)."""
    from transforms.io import io_utils  # noqa: PLC0415

    summary = read_summary(output)
    if summary is not None and summary["format"] != fmt:
        raise _config_error(f"--output {output}: it holds a {summary['format']} export; a {fmt} export goes to its "
                            f"own directory (by default DATASET/{fmt}): choose another --output")
    if summary is not None and summary.get("by_source", False) != by_source:
        raise _config_error(f"--output {output}: it holds an export {'with' if summary.get('by_source') else 'without'}"
                            f" --by-source; one {'with' if by_source else 'without'} goes to its own directory: choose "
                            f"another --output")
    marker = os.path.join(output, IN_PROGRESS_MARKER)
    local = io_utils.is_local(output)
    if local and os.path.lexists(marker) and (os.path.islink(marker) or not os.path.isfile(marker)):
        # a directory (or a link, a fifo) there made the output pass as an export's own, and the export failed
        # writing its marker only after its ref was in the dataset: refused before anything, as a bad export.json
        raise _config_error(f"{marker}: not a marker an export wrote (not a regular file); an export never replaces "
                            f"what it did not write: move it away or choose another --output")
    if summary is None and local and os.path.isfile(marker):
        with open(marker, encoding="utf-8", errors="replace") as f:
            killed, _, option = f.read(40).strip().partition(" ")
        if killed and killed != fmt:  # empty: written by an export before the marker named its format
            raise _config_error(f"--output {output}: it holds a killed {killed[:20]} export ({IN_PROGRESS_MARKER}); a "
                                f"{fmt} export goes to its own directory: choose another --output")
        if killed and (option == BY_SOURCE) != by_source:  # as a committed export's by_source, above
            had = "with" if option == BY_SOURCE else "without"
            raise _config_error(f"--output {output}: it holds a killed {fmt} export {had} --by-source "
                                f"({IN_PROGRESS_MARKER}); one {'with' if by_source else 'without'} goes to its own "
                                f"directory: choose another --output")
    return summary


BY_SOURCE = "--by-source"  # after the format in the marker: a killed export with --by-source is not one without


def write_marker(output: str, fmt: str, by_source: bool = False) -> str:
    """The in-progress marker of a local output (its path), naming the export's format (and --by-source)."""
    marker = os.path.join(output, IN_PROGRESS_MARKER)
    with open(marker, "w", encoding="utf-8") as f:
        f.write(fmt + (f" {BY_SOURCE}" if by_source else "") + "\n")
    return marker


def stamp_generation(directory: str) -> None:
    """Mark `directory` (local or an object store's prefix) as a generation this export created."""
    from transforms.io import io_utils  # noqa: PLC0415

    io_utils.write_bytes(_join(directory, GENERATION_STAMP), (os.path.basename(directory.rstrip("/")) + "\n").encode())


def own_generation(output: str, name: str) -> bool:
    """`name` is a generation directory an export created in OUTPUT: a plain name, a real directory (never a link)
    holding the export's stamp (a regular file)."""
    from transforms.io import io_utils  # noqa: PLC0415

    if not (isinstance(name, str) and GENERATION_NAME.fullmatch(name)):
        return False
    if not io_utils.is_local(output):  # an object store has no links; the stamp is an object
        return io_utils.exists(io_utils.join(output, name, GENERATION_STAMP))
    path = os.path.join(output, name)
    stamp = os.path.join(path, GENERATION_STAMP)
    return (not os.path.islink(path) and os.path.isdir(path) and not os.path.islink(stamp)
            and os.path.isfile(stamp))


def remove_generations(output: str, names: list, keep: list) -> None:
    """Remove the generation directories `names` (those an earlier export.json named) that are not in `keep`:
    only those an export created (`own_generation`: its stamp inside), never a link or another path; a name that is
    not one, or a directory of the user's, is kept with a warning."""
    import logging  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    from transforms.io import io_utils  # noqa: PLC0415

    for name in dict.fromkeys(names):
        if not (isinstance(name, str) and GENERATION_NAME.fullmatch(name)) or name in keep:
            continue
        if not own_generation(output, name):  # export.json is read, not trusted: a user's directory stays
            logging.getLogger("pileprep.export").warning(
                "%s: kept %s: export.json names it, but it is not a generation directory an export created (no %s)",
                output, name, GENERATION_STAMP)
            continue
        if not io_utils.is_local(output):
            io_utils.delete_tree(io_utils.join(output, name))
            continue
        shutil.rmtree(os.path.join(output, name))  # never follows a link inside it


def stamped_generations(output: str) -> list:
    """The generation directories an export created in a local OUTPUT (`own_generation`), by name. A killed export's
    new generation is among them though no export.json ever named it (never committed: no reader holds it), so the
    next committed export removes it with the older ones. An object store's are not listed (only those named)."""
    from transforms.io import io_utils  # noqa: PLC0415

    if not io_utils.is_local(output) or not os.path.isdir(output):
        return []
    return [name for name in sorted(os.listdir(output)) if own_generation(output, name)]
