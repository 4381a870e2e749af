"""Inputs that are not what they claim, caught on the driver before any work.

* Only regular files (and objects) are inputs. A FIFO or a symlink to `/dev/zero` matched by `--input` would
  block the driver's first read forever (pipeline/ops/guards.py `sample_text_field` reads the first records):
  such matches are listed as skipped (`not_a_regular_file`), never opened.
* The run's own output and staging are never its input: an `--input` glob that also matches files under
  `--output` (its lock, its shards) or the staging root would make the run read what it writes. Such matches are
  skipped (`inside_output`).
* Compression is what the bytes say, whatever the name: a `.bz2` / `.xz` file (or a `.zst` that is really gzip)
  read as the suffix claims is hundreds of dead letters of binary garbage. The first bytes of every input are
  compared with the format its name selects (transforms/io/read_records.py `compression_problem`); a mismatch is
  a ConfigError naming the file.
"""
from __future__ import annotations

import glob
import os
import re
import stat

from pipeline.errors import ConfigError
from transforms.io import io_utils
from transforms.io.read_records import MAGIC_BYTES, compression_problem
from transforms.io.read_parquet import is_parquet


_LITERAL_HEAD = re.compile(r"[^[*?]*")  # a glob up to its first wildcard


def match_input(pattern: str) -> list:
    """Beam's FileMetadata of every match of one input glob (`--input`, `--decontaminate`, `verify --inputs`,
    `tokenizer train --input`).

    Beam's local filesystem lists the directory before a glob's first wildcard, and a relative glob whose first
    component is already a wildcard (`c*.jsonl`, `*/x.jsonl`) has none: it matched nothing while `./c*.jsonl`
    worked (docs/wip/hostile-review-issue28.md F8). Such a glob is matched as `./<glob>` and its matches keep the
    form the operator wrote (`c.jsonl`, as a plain relative file name is recorded in the ledger)."""
    from apache_beam.io.filesystem import FileMetadata  # noqa: PLC0415 - heavy import
    from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415

    bare = (io_utils.is_local(pattern) and glob.has_magic(pattern) and not os.path.isabs(pattern)
            and "/" not in _LITERAL_HEAD.match(pattern).group(0))
    if not bare:
        return FileSystems.match([pattern])[0].metadata_list
    return [FileMetadata(m.path[2:] if m.path.startswith("./") else m.path, m.size_in_bytes,
                         m.last_updated_in_seconds)
            for m in FileSystems.match(["./" + pattern])[0].metadata_list]


def _inside(path: str, roots: list) -> bool:
    real = os.path.realpath(path)
    return any(os.path.commonpath([real, r]) == r for r in roots)


def screen_inputs(rows: list, output: str, staging_root: str) -> tuple:
    """(rows that are inputs, [{"path", "reason"}] skipped): local matches that are not regular files, or that lie
    under the output or staging directory, are skipped."""
    roots = [os.path.realpath(p) for p in (output, staging_root) if p and io_utils.is_local(p)]
    kept, skipped = [], []
    for row in rows:
        path = row["path"]
        if io_utils.is_local(path):
            try:
                mode = os.stat(path).st_mode  # follows symlinks: a link to /dev/zero is a character device
            except OSError:
                mode = None
            if mode is None or not stat.S_ISREG(mode):
                skipped.append({"path": path, "reason": "not_a_regular_file"})
                continue
            if _inside(path, roots):
                skipped.append({"path": path, "reason": "inside_output"})
                continue
        kept.append(row)
    return kept, skipped


def check_compression(rows: list, flag: str = "--input") -> None:
    """ConfigError naming the first inputs whose leading bytes contradict the compression their name selects."""
    problems = []
    for row in rows:
        path = row["path"]
        if is_parquet(path):
            continue
        with io_utils.open_read(path) as f:
            head = f.read(MAGIC_BYTES)
        problem = compression_problem(path, head)
        if problem:
            problems.append(problem)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ConfigError(f"{flag} {problems[0]}{more}: recompress it as .jsonl.zst or .jsonl.gz, or name it for "
                          f"what it is")


def screen_listed(rows: list, skipped: list, output: str, staging_root: str) -> tuple:
    """`screen_inputs` for the shard job's listing: (rows, skipped with the screened ones added, sorted by path);
    ConfigError when no input is left."""
    kept, screened = screen_inputs(rows, output, staging_root)
    merged = {r["path"]: r for r in screened}
    merged.update({r["path"]: r for r in skipped})  # the glob's own reasons (directory, dangling_symlink) win
    if rows and not kept:
        first = screened[0]
        raise ConfigError(f"--input: no regular input file is left ({len(screened)} skipped, e.g. {first['path']}: "
                          f"{first['reason']})")
    return kept, [merged[p] for p in sorted(merged)]


def readable_inputs(paths: list, flag: str, what: str) -> list:
    """The paths a command other than the shard job (`tokenizer train --input`, `verify --inputs`) may read:
    the same screening as the shard job's listing (regular files only, compression by the first bytes), so a FIFO
    or a link to /dev/zero never blocks it and a .bz2 is not read as text. The skipped ones are logged by name;
    ConfigError when none is left."""
    import logging  # noqa: PLC0415

    kept, skipped = screen_inputs([{"path": p} for p in paths], "", "")
    if skipped:
        shown = ", ".join(f"{r['path']} ({r['reason']})" for r in skipped[:3])
        more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        logging.getLogger("pileprep.inputs").warning("%s: skipped %d match(es) that are not regular files: %s%s",
                                                     flag, len(skipped), shown, more)
    if paths and not kept:
        raise ConfigError(f"{flag}: no regular input file is left for {what} ({len(skipped)} skipped, e.g. "
                          f"{skipped[0]['path']}: {skipped[0]['reason']})")
    check_compression(kept, flag)
    return [r["path"] for r in kept]

