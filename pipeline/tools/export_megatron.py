"""Megatron-LM / NeMo / GPT-NeoX indexed datasets from a committed dataset: `<split>_text_document.bin/.idx`.

Megatron builds its own samples from documents, so the export holds documents, not packed examples: each one
rebuilt whole (its tokens and its EOS, as the tokenizer made them) from the pieces the shards' provenance names
(`piece_doc_ids`, `piece_offsets`; a piece's tokens are its segment's in `input_ids`). Documents come in the
order their first piece appears in the split's shards (manifest order): for `--packing concat` that is the order
the packer laid them, and a document's pieces follow each other; for `--packing best-fit`
(transforms/shard/best_fit.py) a document's pieces are in offset order but apart. A document never crosses a
shard (each shard is one packing group). A mixture weight's repeated copy (one id twice) is a document of its own.

Two passes over the split's shards, each through model_contract's checked reader: the first collects the pieces
(document id, offset, length) and gives each document its place in `.bin`; the second writes every piece's
tokens at its document's place plus its offset, in a file of the known size (so memory is the piece table, not
the tokens). A piece that continues no open document, a document with a gap, or one not ending in EOS is an
error naming the shard and record: nothing is written then.

The `.idx` is Megatron's `MMIDIDX` index (megatron/core/datasets/indexed_dataset.py `_IndexWriter`): version 1,
the dtype code, the sequence and document counts, int32 lengths, int64 byte pointers, int64 document indices
(one sequence per document). The dtype is the one Megatron picks for the vocabulary (`DType.optimal_dtype`):
uint16 below 65,500 ids, else int32. Tests read both back with megatron-core's own `IndexedDataset`.
"""
from __future__ import annotations

import json
import struct

import numpy as np

from model_contract import INPUT_IDS, PIECE_DOC_IDS, PIECE_OFFSETS, SEGMENT_IDS, decode_example, resolve_shard_path
from model_contract.checked_reader import iter_checked_records
from pipeline.tools.export_sources import blend, prefix_names
from transforms.io import io_utils

VERSION = 1
INDEX_HEADER = b"MMIDIDX\x00\x00"
DTYPE_CODES = {np.dtype(np.uint16): 8, np.dtype(np.int32): 4}
BLEND_NAME = "blend.json"
MEGATRON_SPLITS = {"train": "train", "val": "valid", "test": "test"}


class ExportError(ValueError):
    """The shards' provenance does not describe whole documents."""


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


def example_pieces(example: dict, where: str) -> tuple:
    """(doc ids, offsets, lengths, starts) of one decoded example's pieces, checked against its segment ids."""
    segments = example[SEGMENT_IDS]
    docs, offsets = example[PIECE_DOC_IDS], example[PIECE_OFFSETS]
    k = docs.size
    if offsets.size != k or (segments.size and (segments.min() < 0 or segments.max() > k)):
        raise ExportError(f"{where}: segment ids and pieces disagree")
    lengths = np.bincount(segments, minlength=k + 1)[1:]
    real = int(lengths.sum())
    if not np.array_equal(segments[:real], np.repeat(np.arange(1, k + 1), lengths)) or (lengths == 0).any():
        raise ExportError(f"{where}: pieces are not laid end to end from the example's start")
    starts = np.zeros(k, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return docs, offsets, lengths, starts


def _examples(job):
    """(where, decoded example) of every record of the split's shards, in manifest order."""
    for shard in job.shards:
        with io_utils.open_read(resolve_shard_path(job.manifest_file, shard)) as f:
            for r, record in enumerate(iter_checked_records(f, shard)):
                yield shard.path, r, decode_example(record)


def plan_documents(job) -> tuple:
    """Pass 1: (piece -> document number, piece offsets, document lengths, document ids), documents numbered by
    first appearance."""
    piece_doc, piece_offset = [], []
    lengths: list = []
    ids: list = []
    open_docs: dict = {}  # doc id -> [[document number, next offset], ...] of this shard
    shard_path = None
    for path, r, example in _examples(job):
        if path != shard_path:
            open_docs, shard_path = {}, path  # a document never crosses a shard
        docs, offsets, lens, _starts = example_pieces(example, f"{path} record {r}")
        for doc_id, offset, n in zip(docs.tolist(), offsets.tolist(), lens.tolist()):
            copies = open_docs.setdefault(doc_id, [])
            if offset == 0:
                copies.append([len(lengths), n])
                number = len(lengths)
                lengths.append(n)
                ids.append(doc_id)
            else:
                match = next((c for c in copies if c[1] == offset), None)
                if match is None:
                    raise ExportError(f"{path} record {r}: a piece of document {doc_id:x} at offset {offset} "
                                      f"continues no piece of it before (a gap, or pieces out of order)")
                number = match[0]
                match[1] += n
                lengths[number] += n
            piece_doc.append(number)
            piece_offset.append(offset)
    return (np.array(piece_doc, dtype=np.int64), np.array(piece_offset, dtype=np.int64),
            np.array(lengths, dtype=np.int64), np.array(ids, dtype=np.int64))


def write_bins(job, plan: tuple, doc_file: np.ndarray, paths: list, dtype: np.dtype, eos_id: int) -> list:
    """Pass 2: every document's tokens at its place in `paths[doc_file[document]]` (documents keep their order
    inside each file); returns each file's document lengths."""
    piece_doc, piece_offset, lengths, _ids = plan
    starts = np.zeros(lengths.size, dtype=np.int64)
    per_file = []
    for k, path in enumerate(paths):
        mine = np.flatnonzero(doc_file == k)
        own = lengths[mine]
        if own.size:
            starts[mine[1:]] = np.cumsum(own[:-1])
        per_file.append((mine, own))
        with open(path, "wb") as f:
            f.truncate(int(own.sum()) * dtype.itemsize)
    outs = [np.memmap(p, dtype=dtype, mode="r+", shape=(int(own.sum()),)) if own.size else None
            for p, (_mine, own) in zip(paths, per_file)]
    info = np.iinfo(dtype)
    p = 0
    if lengths.size:
        for shard_path, r, example in _examples(job):
            ids = example[INPUT_IDS]
            _docs, _offsets, lens, at = example_pieces(example, f"{shard_path} record {r}")
            if ids.size and (ids.min() < info.min or ids.max() > info.max):
                raise ExportError(f"{shard_path} record {r}: a token id does not fit {dtype} (the vocabulary's "
                                  f"dtype)")
            for n, a in zip(lens.tolist(), at.tolist()):
                d = piece_doc[p]
                dst = int(starts[d] + piece_offset[p])
                outs[doc_file[d]][dst:dst + n] = ids[a:a + n]
                p += 1
    for out, (mine, own) in zip(outs, per_file):
        if out is None:
            continue
        out.flush()
        ends = out[starts[mine] + own - 1]
        if (ends != eos_id).any():
            bad = int(np.flatnonzero(ends != eos_id)[0])
            raise ExportError(f"split {job.split}: document {bad} does not end with EOS ({eos_id}): its pieces do "
                              f"not make it whole")
    del outs
    return [own for _mine, own in per_file]


def index_bytes(lengths: np.ndarray, dtype: np.dtype) -> bytes:
    """Megatron's `.idx` for one sequence per document."""
    n = lengths.size
    pointers = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1] * dtype.itemsize, out=pointers[1:])
    return b"".join((INDEX_HEADER, struct.pack("<Q", 1), struct.pack("<B", DTYPE_CODES[dtype]),
                     struct.pack("<Q", n), struct.pack("<Q", n + 1), lengths.astype("<i4").tobytes(),
                     pointers.astype("<i8").tobytes(), np.arange(n + 1, dtype="<i8").tobytes()))


def write_split(job) -> list:
    """`<split>_text_document.bin/.idx`; with `job.sources` (pipeline/tools/export_sources.py) one pair per source,
    `<split>_<source>_text_document.bin/.idx`, each read by Megatron as a dataset of its own (a blend)."""
    tokenizer = job.manifest.contract.tokenizer
    dtype = token_dtype(tokenizer.vocab_size)
    plan = plan_documents(job)
    if job.sources is None:
        names, doc_file, sources = [f"{job.split}_text_document"], np.zeros(plan[2].size, dtype=np.int64), [None]
    else:
        number = job.sources.lookup(plan[3])
        present = sorted({job.sources.names[int(n)] for n in np.unique(number)})
        parts = prefix_names(job.sources.names)
        names = [f"{job.split}_{parts[s]}_text_document" for s in present]
        to_file = np.full(len(job.sources.names), -1, dtype=np.int64)
        for k, s in enumerate(present):
            to_file[job.sources.names.index(s)] = k
        doc_file, sources = to_file[number.astype(np.int64)], present
    lengths: list = []

    def fill_bins(tmps: list) -> None:
        lengths.extend(write_bins(job, plan, doc_file, tmps, dtype, tokenizer.eos_id))

    rows = job.put_many([n + ".bin" for n in names], fill_bins)
    rows += job.put_many([n + ".idx" for n in names],
                         lambda tmps: [_write_index(t, ls, dtype) for t, ls in zip(tmps, lengths)])
    for k, source in enumerate(sources):
        for row in (rows[k], rows[len(names) + k]):
            row.update(documents=int(lengths[k].size), tokens=int(lengths[k].sum()), prefix=names[k])
            if source is not None:
                row["source"] = source
    if job.sources is not None:
        check_sources(job, sources, lengths)
    return rows


def _write_index(path: str, lengths: np.ndarray, dtype: np.dtype) -> None:
    with open(path, "wb") as f:
        f.write(index_bytes(lengths, dtype))


def check_sources(job, sources: list, lengths: list) -> None:
    """Each source's documents and tokens in this split equal the manifest's `sources` section: the sources read
    again from the inputs are the dataset's (pipeline/tools/export_sources.py)."""
    want = {s: per.get(job.split) for s, per in (job.manifest.sources or {}).items() if per.get(job.split)}
    got = {s: {"documents": int(ls.size), "tokens": int(ls.sum())} for s, ls in zip(sources, lengths)}
    for source in sorted(set(want) | set(got)):
        w = {k: int((want.get(source) or {}).get(k, 0)) for k in ("documents", "tokens")}
        if got.get(source, {"documents": 0, "tokens": 0}) != w:
            raise ExportError(f"split {job.split}, source {source!r}: {got.get(source)} from the inputs, the "
                              f"manifest says {w}: the inputs do not tell the sources as the dataset has them")


def finish(job, splits: list, files: list) -> list:
    """With --by-source: `blend.json`, Megatron-LM's `--per-split-data-args-path` file ({"train": [weight,
    prefix, ...], "valid": ..., "test": ...}; prefixes relative to the export's output directory)."""
    if job.sources is None:
        return []
    text = json.dumps(blends(files), indent=1, sort_keys=True) + "\n"

    def fill(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    return [job.put(BLEND_NAME, fill)]


def blends(files: list) -> dict:
    """Per split Megatron's blend list from export.json's rows (`.bin` rows carry prefix and tokens); Megatron
    calls the validation split `valid`."""
    out = {}
    for split in ("train", "val", "test"):
        bins = [r for r in files if r.get("split") == split and r["path"].endswith(".bin") and "source" in r]
        if bins:
            gen_dir = bins[0]["path"].rsplit("/", 1)[0] + "/" if "/" in bins[0]["path"] else ""
            out[MEGATRON_SPLITS[split]] = blend([gen_dir + r["prefix"] for r in bins], [r["tokens"] for r in bins])
    return out


def blend_arguments(summary: dict, output: str) -> list:
    """`--train-data-path W PREFIX ...` (and valid, test) with absolute prefixes: what the CLI prints."""
    import os  # noqa: PLC0415

    lines = []
    for split, items in (summary.get("megatron", {}).get("blend") or {}).items():
        args = [a if i % 2 == 0 else os.path.join(output, a) for i, a in enumerate(items)]
        lines.append(f"--{split}-data-path " + " ".join(args))
    return lines


def describe(manifest, files: list) -> dict:
    dtype = token_dtype(manifest.contract.tokenizer.vocab_size)
    info = {"dtype": dtype.name, "document_prefix": "<split>_text_document", "eos_id": manifest.contract.tokenizer.eos_id}
    if any("source" in r for r in files):  # --by-source: the prefixes and Megatron's blend per split
        info.update(document_prefix="<split>_<source>_text_document", blend=blends(files),
                    prefixes={r["source"]: r["prefix"].split("_", 1)[1].rsplit("_text_document", 1)[0]
                              for r in files if "source" in r})
    return {"megatron": info}
