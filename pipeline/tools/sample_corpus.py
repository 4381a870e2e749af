"""A Pile-format sample corpus built at run time from text every Python installation already has.

`make shard` and the tests need real text (so tokenizer training, packing and throughput figures mean
something) without downloading anything or committing third-party text to the repository. Two sources:

- "StdlibCode": the standard library's `*.py` files, its test suite included (`site-packages` excluded);
- "PackageDocs": READMEs, licences and `METADATA` of the installed distributions (`*.txt`, `*.rst`, `*.md`,
  `LICENSE*`, `*.dist-info/METADATA`) under site-packages, plus the stdlib's own text files;
- "PackageCode", only on installations too small to reach the target otherwise (e.g. a distro Python without
  its test suite): the `*.py` files of the installed packages fill the remainder.

When even that falls short (`--size-mb 384` for the throughput benchmark), the documents already
collected are repeated as marked copies: copy k of a document is its text plus one trailing line
`# pileprep sample copy k`, with `"copy": k` in its meta. A copy's text differs from its original's and from
every other copy's, so exact dedup keeps it, and the mix of sources and text stays that of the installation.

Layout (the Pile's): `train/00.jsonl.zst … 07.jsonl.zst`, `val.jsonl.zst`, `test.jsonl.zst`, one JSON line per
document: `{"text": ..., "meta": {"pile_set_name": source, "path": path relative to its root}}`.

Determinism: candidate files are listed, sorted by path, then visited in the order of a keyed hash of their
relative path (a spread over the whole tree rather than the alphabetically first packages, and independent of
the filesystem's listing order). Nothing depends on time or unseeded randomness, so two runs on one
installation write identical bytes. Files are written under a temporary name and renamed, so a crash never
leaves a half-written `.zst`.

Ownership: `OWNED_NAME` in the output directory lists every file the command wrote with its sha256. A later run
replaces a file only when that list names it with those bytes (an earlier sample, unchanged); any other file at
one of its names (a real val/test, a sample edited since) is refused before anything is written (exit 2) unless
`--overwrite`. It never writes through a symbolic link inside the output (a link at `train/`, or at a file).
"""
from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from dataclasses import dataclass

import zstandard

from transforms.io import io_utils

STDLIB_CODE = "StdlibCode"
PACKAGE_DOCS = "PackageDocs"
PACKAGE_CODE = "PackageCode"  # filler, only when the two main sources fall short of the target
NUM_TRAIN_FILES = 8
# Every HOLDOUT_PERIOD-th document of a source goes to val (index 1) and test (index 2): ~1.6% each, and
# never empty once a source has 3 documents.
HOLDOUT_PERIOD = 64
DOCS_SHARE = 0.25  # at most this share of the target comes from PackageDocs (only a few MB exist anyway)
COPY_MARKER = "\n# pileprep sample copy {k}\n"  # appended to copy k (k >= 1) of a document
MAX_FILE_BYTES = 1 << 20  # skip giant generated files (data tables, bundled notices)
ZSTD_LEVEL = 3
_SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages"}


@dataclass(frozen=True)
class _Candidate:
    root: str
    rel: str  # relative to root, "/"-separated


def _is_doc_name(name: str) -> bool:
    return name.endswith((".txt", ".rst", ".md")) or name.startswith("LICENSE")


def _walk(root: str, want, skip_dirs=_SKIP_DIRS) -> list[_Candidate]:
    found = []
    if not root or not os.path.isdir(root):
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip_dirs)
        rel_dir = os.path.relpath(dirpath, root)
        for name in sorted(filenames):
            rel = name if rel_dir == "." else os.path.join(rel_dir, name)
            if want(rel, name):
                found.append(_Candidate(root, rel.replace(os.sep, "/")))
    return found


def _spread_order(cands: list[_Candidate]) -> list[_Candidate]:
    """Sorted by path, then by a keyed hash of the path: a deterministic spread over the whole tree."""
    def key(c: _Candidate):
        return hashlib.blake2b(c.rel.encode("utf-8"), digest_size=8, person=b"pileprep-samp").digest(), c.rel
    return sorted(sorted(cands, key=lambda c: (c.rel, c.root)), key=key)


def _site_roots() -> list[str]:
    paths = sysconfig.get_paths()
    return sorted({os.path.realpath(paths[k]) for k in ("purelib", "platlib") if paths.get(k)})


def _stdlib_root() -> str:
    return os.path.realpath(sysconfig.get_paths()["stdlib"])


def stdlib_code_candidates() -> list[_Candidate]:
    return _walk(_stdlib_root(), lambda rel, name: name.endswith(".py"))


def package_doc_candidates() -> list[_Candidate]:
    cands = []
    for root in _site_roots():
        cands += _walk(root, lambda rel, name: _is_doc_name(name) or (
            name == "METADATA" and rel.split(os.sep)[0].endswith(".dist-info")), skip_dirs={"__pycache__"})
    cands += _walk(_stdlib_root(), lambda rel, name: _is_doc_name(name))
    return cands


def package_code_candidates() -> list[_Candidate]:
    cands = []
    for root in _site_roots():
        cands += _walk(root, lambda rel, name: name.endswith(".py"), skip_dirs={"__pycache__"})
    return cands


def _read_text(c: _Candidate) -> str | None:
    """The file's text, or None when it is too big, not UTF-8, or blank."""
    path = os.path.join(c.root, c.rel)
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            return None
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return text if text.strip() else None


def _collect(source: str, cands: list[_Candidate], budget: int) -> list[bytes]:
    """JSON lines (with "\\n") of one source, in spread order, until `budget` bytes are reached."""
    lines, total, seen = [], 0, set()
    for c in _spread_order(cands):
        if total >= budget:
            break
        if c.rel in seen:  # the same relative path under two roots: keep the first
            continue
        text = _read_text(c)
        if text is None:
            continue
        seen.add(c.rel)
        line = (json.dumps({"text": text, "meta": {"pile_set_name": source, "path": c.rel}},
                           ensure_ascii=False) + "\n").encode("utf-8")
        lines.append(line)
        total += len(line)
    return lines


def _fill_with_copies(by_source: dict[str, list[bytes]], short: int) -> int:
    """Append marked copies of the collected documents (copy 1 of each, then copy 2, ...; sources in name
    order, documents in collection order) to their source until `short` more bytes are reached; return how
    many copies were made."""
    originals = {source: list(lines) for source, lines in sorted(by_source.items()) if lines}
    if not originals:
        raise ValueError("no text to sample: the installation has no readable source or documentation files")
    added, made, k = 0, 0, 0
    while added < short:
        k += 1
        for source, lines in originals.items():
            for line in lines:
                if added >= short:
                    return made
                record = json.loads(line)
                record["text"] += COPY_MARKER.format(k=k)
                record["meta"]["copy"] = k
                copy = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
                by_source[source].append(copy)
                added += len(copy)
                made += 1
    return made


OWNED_NAME = ".pileprep-sample.json"


def output_names() -> list:
    """The files a sample corpus consists of, relative to its directory."""
    return [f"train/{i:02d}.jsonl.zst" for i in range(NUM_TRAIN_FILES)] + ["val.jsonl.zst", "test.jsonl.zst"]


def _owned(output_dir: str) -> dict:
    """{relative name: sha256} of the files an earlier run wrote ({} when there is no readable list)."""
    try:
        with open(os.path.join(output_dir, OWNED_NAME), encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, ValueError):
        return {}
    files = d.get("files") if isinstance(d, dict) else None
    return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(files, dict) else {}


def _sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_output(output_dir: str, overwrite: bool) -> None:
    """ConfigError (exit 2) before any work: a link on the way to a file this command writes, or (without
    `overwrite`) a file at one of its names that an earlier sample run did not write with these bytes."""
    from pipeline.errors import ConfigError  # noqa: PLC0415

    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ConfigError(f"--output {output_dir}: it is a file, not a directory: choose another --output")
    owned, foreign = _owned(output_dir), []
    for rel in output_names() + [OWNED_NAME]:
        path = os.path.join(output_dir, rel)
        links = io_utils.links_below(output_dir, os.path.dirname(path)) + (
            [path] if os.path.islink(path) else [])
        if links:
            raise ConfigError(f"--output {output_dir}: {links[0]} is a symbolic link; the sample is never written "
                              f"through a link: remove it or choose another --output")
        if rel != OWNED_NAME and os.path.lexists(path) and (
                not os.path.isfile(path) or owned.get(rel) != _sha256_of(path)):
            foreign.append(rel)
    if foreign and not overwrite:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ConfigError(f"--output {output_dir}: it holds {shown}, which pileprep sample did not write (or which "
                          f"changed since); pass --overwrite to replace them, or choose another --output")
    bad = [rel for rel in foreign if not os.path.isfile(os.path.join(output_dir, rel))]
    if bad:
        raise ConfigError(f"--output {output_dir}: {bad[0]} is not a regular file: choose another --output")


def write_sample_corpus(output_dir: str, *, target_mb: float = 24.0, overwrite: bool = False) -> dict:
    """Write the sample corpus under `output_dir` (a local path); return a summary of what was written."""
    if target_mb <= 0:
        raise ValueError(f"target_mb must be positive, got {target_mb}")
    check_output(output_dir, overwrite)
    target = int(target_mb * 1e6)
    by_source = {PACKAGE_DOCS: _collect(PACKAGE_DOCS, package_doc_candidates(), int(target * DOCS_SHARE))}
    docs_bytes = sum(map(len, by_source[PACKAGE_DOCS]))
    by_source[STDLIB_CODE] = _collect(STDLIB_CODE, stdlib_code_candidates(), target - docs_bytes)
    short = target - docs_bytes - sum(map(len, by_source[STDLIB_CODE]))
    if short > 0:
        by_source[PACKAGE_CODE] = _collect(PACKAGE_CODE, package_code_candidates(), short)
        short -= sum(map(len, by_source[PACKAGE_CODE]))
    copies = _fill_with_copies(by_source, short) if short > 0 else 0

    train = [[] for _ in range(NUM_TRAIN_FILES)]
    holdout = {"val": [], "test": []}
    for source in sorted(by_source):
        n_train = 0
        for i, line in enumerate(by_source[source]):
            slot = i % HOLDOUT_PERIOD
            if slot == 1:
                holdout["val"].append(line)
            elif slot == 2:
                holdout["test"].append(line)
            else:  # per-source round-robin: every train file mixes both sources
                train[n_train % NUM_TRAIN_FILES].append(line)
                n_train += 1

    outputs = {f"train/{i:02d}.jsonl.zst": lines for i, lines in enumerate(train)}
    outputs.update({f"{name}.jsonl.zst": lines for name, lines in holdout.items()})
    files, compressed, uncompressed, owned = [], 0, 0, {}
    for rel, lines in outputs.items():
        data = b"".join(lines)
        blob = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)
        # listed as ours before it is written: a crash in between leaves a listed file that is missing or has
        # other bytes, which the next run then treats as not its own
        owned[rel] = hashlib.sha256(blob).hexdigest()
        io_utils.replace_atomically(os.path.join(output_dir, OWNED_NAME), (json.dumps(
            {"files": {**_owned(output_dir), **owned}}, sort_keys=True, indent=1) + "\n").encode("utf-8"))
        io_utils.replace_atomically(os.path.join(output_dir, rel), blob)
        compressed += len(blob)
        uncompressed += len(data)
        files.append(rel)
    return {
        "output_dir": output_dir,
        "files": files,
        "documents": {s: len(v) for s, v in sorted(by_source.items())},
        "copies": copies,
        "uncompressed_bytes_by_source": {s: sum(map(len, v)) for s, v in sorted(by_source.items())},
        "documents_by_split": {"train": sum(map(len, train)), "val": len(holdout["val"]),
                               "test": len(holdout["test"])},
        "uncompressed_bytes": uncompressed,
        "compressed_bytes": compressed,
    }
