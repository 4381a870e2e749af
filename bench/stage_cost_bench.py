"""Where the shard job's CPU goes per token, stage by stage, against gigatoken's own speed on the same documents.

    python bench/stage_cost_bench.py --corpus DIR --tokenizer MODEL [--repeat N]

DIR is a bench corpus (bench/shard_bench.py build_corpus: train/*.jsonl.zst, val.jsonl.zst, test.jsonl.zst, and
the plain megatron.jsonl that bench/megatron_side_by_side.py writes beside them). One process, one thread, the
job's own pure stage functions (no Beam, no worker start-up), in the order the job runs them:

- read: the cut stage's reader (zstd frames, line split, record checks: transforms/shard/cut.py InputCutter);
- JSON: the record parser alone (transforms/shard/documents.py loads_record);
- ids: the document id, split and seeded sort key of each document (documents.py);
- tokenizer: the job's encoder (routing by the exact domain, spot checks) over the stage's batches
  (transforms/tokenize/tokenizer.py encode_batch), a fresh one after the stage so both start with cold caches;
- tokenize glue: the rest of the tokenize stage (parse checks, statistics, the unit's index and token files):
  transforms/shard/tokenize_unit.py tokenize_records minus the three rows above it;
- pack + frame: transforms/shard/pack.py pack_shard minus the next row (exact dedup, packing, TFRecord framing
  with CRC32C);
- write + sha256: writing the shards' bytes and hashing them, timed again on the bytes pack_shard wrote.

Each row in CPU-seconds per 100 M tokens (the tokens the tokenize stage counted), median of --repeat passes.
Floors, on the same documents: gigatoken `encode` one document at a time (the call the job makes) and
gigatoken's own file reader and encoder, `encode_files(JsonlFileSource(megatron.jsonl), parallel=False)` on one
thread (the JSON reading and tokenizing of Megatron-LM's tools/preprocess_data_fast.py, without its threads).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402

from pipeline.shard import manifest_builder  # noqa: E402
from transforms.shard import corpus_stats, cut, exact_dedup, pack, tokenize_unit  # noqa: E402
from transforms.shard.documents import (HASHED, Document, assign_split, document_id, loads_record,  # noqa: E402
                                        parse_record, sort_key)
from transforms.tokenize import fast_encoders, tokenizer, tokenizer_backends  # noqa: E402

CHUNK_BYTES = 3 << 20  # bench/shard_bench.py UNIT_MB
SEQ_LEN = 2048


def cpu() -> float:
    return time.process_time()


def one_pass(files: list, splits: list, mb: bytes, sp, choice, work: str) -> dict:
    """CPU-seconds of every row, once, over `files` (their split per file in `splits`)."""
    fast_encoders._gigatoken_tokenizer.cache_clear()  # noqa: SLF001 - cold caches, as a worker starts
    enc = tokenizer_backends.make_encoder(choice, mb, sp)
    mask = corpus_stats.byte_piece_mask(enc)
    dtype = tokenizer.token_dtype(sp.GetPieceSize())
    settings = tokenize_unit.TokenizeSettings("text", ("meta.pile_set_name",), 0.0, 0.0, 0, tuple(splits))
    rows = dict.fromkeys(("read", "JSON", "ids", "tokenizer", "tokenize stage", "pack stage", "write + sha256"), 0.0)
    units = []
    for file_idx, path in enumerate(files):
        t = cpu()
        chunks = list(cut.InputCutter(file_idx, path, CHUNK_BYTES, 64 << 20, chunk_bytes=CHUNK_BYTES).chunks())
        rows["read"] += cpu() - t
        records = [data for _ref, recs in chunks for _line, data in recs]
        t = cpu()
        for data in records:
            loads_record(data)
        rows["JSON"] += cpu() - t
        docs = [d for d in (parse_record(data) for data in records) if isinstance(d, Document)]
        t = cpu()
        for d in docs:
            sort_key(document_id(d.text), assign_split(d.doc_id, splits[file_idx], 0.0, 0.0), 0)
        rows["ids"] += cpu() - t
        t = cpu()
        for ref, recs in chunks:
            units.append(tokenize_unit.tokenize_records(ref, recs, enc, dtype, settings, work, work, mask))
        rows["tokenize stage"] += cpu() - t
    # The tokenizer alone on a fresh encoder (its caches cold, as the stage's were), over the same documents in
    # the same order: timed after the stage, not inside it, so neither warms the other's caches
    fast_encoders._gigatoken_tokenizer.cache_clear()  # noqa: SLF001 - a second, cold gigatoken object
    enc = tokenizer_backends.make_encoder(choice, mb, sp)
    for file_idx, path in enumerate(files):
        records = [data for _ref, recs in cut.InputCutter(file_idx, path, CHUNK_BYTES, 64 << 20,
                                                           chunk_bytes=CHUNK_BYTES).chunks() for _line, data in recs]
        texts = [d.text for d in (parse_record(data) for data in records) if isinstance(d, Document)]
        t = cpu()
        for at in range(0, len(texts), tokenize_unit.TOKENIZE_BATCH_DOCS):  # the stage's batches, by count
            tokenizer.encode_batch(enc, texts[at:at + tokenize_unit.TOKENIZE_BATCH_DOCS])
        rows["tokenizer"] += cpu() - t
    config = SimpleNamespace(mixture_weights=None, num_shards=None, target_shard_mb=16)
    t = cpu()
    units.sort(key=lambda u: u.name)
    dedup = exact_dedup.index_held_out_ids(units, work)
    results = [pack.pack_shard(task, units, SEQ_LEN, sp.eos_id(), max(sp.pad_id(), 0), work, dedup, work)
               for task in manifest_builder.shard_write_tasks(units, config)]
    rows["pack stage"] = cpu() - t
    shards = []
    for result in results:  # read back untimed; then written and hashed again, as pack_shard's writer does
        with open(result.path, "rb") as f:
            shards.append(f.read())
    t = cpu()
    for data in shards:
        hashlib.sha256(data).hexdigest()
        with open(os.path.join(work, "rewrite.bin"), "wb") as f:
            f.write(data)
    rows["write + sha256"] = cpu() - t
    rows["tokens"] = sum(s["tokens"] for u in units for s in u.source_stats.values())
    return rows


def floors(files_jsonl: str, texts: list, mb: bytes) -> dict:
    import gigatoken  # noqa: PLC0415
    from transforms.tokenize import formats  # noqa: PLC0415

    gigatoken.set_max_cache_bytes(fast_encoders.GIGATOKEN_CACHE_BYTES)
    tok = gigatoken.Tokenizer.from_json(fast_encoders.gigatoken_tokenizer_json(mb, formats.SENTENCEPIECE))
    t = cpu()
    for text in texts:
        tok.encode(text)
    per_doc = cpu() - t
    gigatoken.set_max_cache_bytes(None)  # encode_files' own default bound, as Megatron's script runs it
    tok = gigatoken.Tokenizer.from_json(fast_encoders.gigatoken_tokenizer_json(mb, formats.SENTENCEPIECE))
    t = cpu()
    out = tok.encode_files(gigatoken.JsonlFileSource([files_jsonl]), parallel=False)
    files_cpu = cpu() - t
    import awkward as ak  # noqa: PLC0415 - gigatoken's batch results are awkward arrays

    return {"encode per document": per_doc, "encode_files (one thread)": files_cpu,
            "files_tokens": int(ak.sum(ak.num(out, axis=1)))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    train = sorted(os.path.join(args.corpus, "train", n) for n in os.listdir(os.path.join(args.corpus, "train")))
    files = train + [os.path.join(args.corpus, "val.jsonl.zst"), os.path.join(args.corpus, "test.jsonl.zst")]
    splits = [HASHED] * len(train) + [1, 2]
    with open(args.tokenizer, "rb") as f:
        mb = f.read()
    sp = tokenizer.load_processor(mb)
    sample = tokenizer_backends.sample_documents(
        train, "text", 0, parse=lambda d: getattr(parse_record(d), "text", None),
        read=lambda p: ((line, data) for ref, recs in cut.InputCutter(0, p, CHUNK_BYTES, 64 << 20).chunks()
                        for line, data in recs))
    choice = tokenizer_backends.choose_backend("auto", mb, sp, sample)
    passes = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as work:
            passes.append(one_pass(files, splits, mb, sp, choice, work))
    rows = {k: statistics.median(p[k] for p in passes) for k in passes[0]}
    tokens = rows.pop("tokens")
    rows["tokenize glue"] = rows["tokenize stage"] - rows["JSON"] - rows["ids"] - rows["tokenizer"]
    rows["pack + frame"] = rows["pack stage"] - rows["write + sha256"]
    texts = [json.loads(line)["text"] for line in open(os.path.join(args.corpus, "megatron.jsonl"), "rb")]
    floor = floors(os.path.join(args.corpus, "megatron.jsonl"), texts, mb)
    per = 1e8 / tokens
    print(f"{tokens:,} tokens, backend {choice.name}, median of {args.repeat}; CPU-s per 100 M tokens")
    print(f"{'row':28s} {'CPU-s/100M':>10s}")
    for key in ("read", "JSON", "ids", "tokenizer", "tokenize glue", "pack + frame", "write + sha256"):
        print(f"{key:28s} {rows[key] * per:10.2f}")
    total = rows["read"] + rows["tokenize stage"] + rows["pack stage"]
    print(f"{'total (read + tokenize + pack)':28s} {total * per:10.2f}")
    print(f"floor: gigatoken encode per document     {floor['encode per document'] * per:8.2f}")
    print(f"floor: gigatoken encode_files, 1 thread  {floor['encode_files (one thread)'] * 1e8 / floor['files_tokens']:8.2f}"
          f"  ({floor['files_tokens']:,} tokens: the control-token text counted its way)")


if __name__ == "__main__":
    main()
