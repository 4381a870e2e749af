"""Writers for test corpora: good Pile-format files and every kind of bad input the reader must survive."""
from __future__ import annotations

import gzip
import json
import pathlib

import zstandard

from tests.conftest import stdlib_texts

SOURCES = ("StdlibCode", "Docs", "Pile-CC")


def pile_line(text, source) -> bytes:
    return json.dumps({"text": text, "meta": {"pile_set_name": source}}, ensure_ascii=False).encode() + b"\n"


def good_documents(limit_bytes: int, skip: int = 0, doc_chars: int = 4000) -> list:
    """(text, source) pairs: stdlib sources cut at line ends into ~doc_chars documents, sources round-robin."""
    pieces = []
    for _name, text in stdlib_texts(limit_bytes, skip):
        lines = text.splitlines(keepends=True)
        current = ""
        for line in lines:
            current += line
            if len(current) >= doc_chars:
                pieces.append(current)
                current = ""
        if current.strip():
            pieces.append(current)
    return [(text, SOURCES[i % len(SOURCES)]) for i, text in enumerate(pieces)]


def write_zst(path: pathlib.Path, lines: list, frames: int = 1) -> None:
    """Write lines as `frames` concatenated zstd frames (the Pile is one frame; pzstd-style files are many)."""
    cctx = zstandard.ZstdCompressor(level=3)
    per = max(1, -(-len(lines) // frames))
    with open(path, "wb") as f:
        for i in range(0, len(lines), per):
            f.write(cctx.compress(b"".join(lines[i:i + per])))


def write_bad_inputs(root: pathlib.Path) -> dict:
    """One file per damage kind; returns {file name: expected dead-letter / filter reasons}."""
    root.mkdir(parents=True, exist_ok=True)
    # > several 128 KiB zstd blocks; marked so that no text equals one of write_good_corpus's (one id per text)
    good = [pile_line("# damaged-file fixture\n" + t, s) for t, s in good_documents(600_000, skip=40)]
    # truncated zstd: the complete lines before the cut survive, the rest is one dead letter
    blob = zstandard.ZstdCompressor(level=3).compress(b"".join(good))
    (root / "truncated.jsonl.zst").write_bytes(blob[: len(blob) * 2 // 3])
    (root / "empty.jsonl.zst").write_bytes(b"")
    (root / "plaintext.jsonl.zst").write_bytes(b"".join(good[:3]))
    # gzip cut short
    gz = gzip.compress(b"".join(good))
    (root / "cut.jsonl.gz").write_bytes(gz[: len(gz) // 2])
    mixed = [
        pile_line("A fine first document.\nWith two lines.", "Pile-CC"),
        b'{"text": "unterminated\n',  # invalid JSON
        b'{"meta": {"pile_set_name": "Pile-CC"}}\n',  # missing text
        b'{"text": null, "meta": {}}\n',  # null text
        b'{"text": 42, "meta": {}}\n',  # non-string text
        b'{"text": "bad \xff\xfe bytes", "meta": {}}\n',  # invalid UTF-8
        b'{"text": "lone \\ud800 surrogate", "meta": {}}\n',  # lone surrogate escape
        b'{"text": "", "meta": {}}\n',  # empty text
        b'{"text": " \\n\\t ", "meta": {}}\n',  # whitespace-only text
        b"\n",  # blank line
        b'["an", "array"]\n',  # not an object
        pile_line("CRLF line endings are stripped.", "Docs").rstrip(b"\n") + b"\r\n",
        pile_line("The last line has no final newline.", "Docs").rstrip(b"\n"),
    ]
    (root / "mixed.jsonl").write_bytes(b"".join(mixed))
    return {
        "truncated.jsonl.zst": {"dead_lettered": {"zstd_truncated": 1}},
        "empty.jsonl.zst": {"dead_lettered": {"zstd_empty_file": 1}},
        "plaintext.jsonl.zst": {"dead_lettered": {"zstd_corrupt": 1}},
        "cut.jsonl.gz": {"dead_lettered": {"gzip_truncated": 1}},
        "mixed.jsonl": {"dead_lettered": {"invalid_json": 1, "text_missing": 1, "text_null": 1,
                                          "text_not_a_string": 1, "invalid_utf8": 1, "lone_surrogate": 1,
                                          "not_a_json_object": 1},
                        "filtered": {"empty_text": 2, "blank_line": 1}, "written": 3},
    }


def write_good_corpus(root: pathlib.Path, limit_bytes: int = 1_500_000, files: int = 3) -> list:
    """A small multi-file, multi-frame corpus; returns the (text, source) documents written."""
    root.mkdir(parents=True, exist_ok=True)
    docs = good_documents(limit_bytes)
    for f in range(files):
        lines = [pile_line(t, s) for t, s in docs[f::files]]
        write_zst(root / f"{f:02d}.jsonl.zst", lines, frames=2 if f == 0 else 1)
    # an exact duplicate of a document, in another file: filtered as "duplicate", never trained on twice
    (root / "dup.jsonl").write_bytes(pile_line(*docs[0]))
    return docs
