"""Real MiniLM vectors for the retrieval benches, cached: a corpus's documents cut into 64-token chunks with a
SentencePiece model (the chunking of transforms/retrieval/retrieval_chunks.py: every document's chunks contiguous,
document after document), each chunk's decoded text encoded by all-MiniLM-L6-v2 on CPU.

    nice -n 10 python bench/retrieval_corpus.py --input 'out/sample-corpus/train/*.jsonl.zst' \
        --tokenizer ../shared/data/tokenizers/llama2-bpe-32k.model --chunks 120000

writes out/bench/minilm-<key>.npz (`vectors` float32 [n, 384], `doc_ids` int64 [n], `chunk_index` int64 [n])
and saves what it has every --save-every chunks, so a long encode can be read before it ends. The key hashes the
inputs' names and sizes, the tokenizer file and the chunk length; rerunning resumes from the saved prefix.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import io
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

CHUNK_LEN = 64


def iter_texts(pattern: str):
    import zstandard  # noqa: PLC0415

    for path in sorted(glob.glob(pattern)):
        with open(path, "rb") as f:
            reader = io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(f), encoding="utf-8")
            for line in reader:
                if line.strip():
                    yield json.loads(line)["text"]


def cache_key(pattern: str, tokenizer_file: str) -> str:
    h = hashlib.sha256()
    for path in sorted(glob.glob(pattern)):
        h.update(f"{os.path.basename(path)}:{os.path.getsize(path)};".encode())
    h.update(open(tokenizer_file, "rb").read())
    h.update(str(CHUNK_LEN).encode())
    return h.hexdigest()[:16]


def chunk_corpus(pattern: str, tokenizer_file: str, limit: int):
    import sentencepiece as spm  # noqa: PLC0415

    sp = spm.SentencePieceProcessor(model_file=tokenizer_file)
    texts, doc_ids, chunk_index = [], [], []
    for d, text in enumerate(iter_texts(pattern)):
        ids = sp.encode(text)
        for c in range(0, len(ids), CHUNK_LEN):
            texts.append(sp.decode(ids[c:c + CHUNK_LEN]))
            doc_ids.append(d)
            chunk_index.append(c // CHUNK_LEN)
        if len(texts) >= limit:
            break
    # whole documents only, up to the limit (a cut document would change the exclusion ranges)
    n = len(texts)
    if n > limit:
        last = doc_ids[limit - 1]
        n = limit if doc_ids[limit] != last else doc_ids.index(last)
    return texts[:n], np.asarray(doc_ids[:n], np.int64), np.asarray(chunk_index[:n], np.int64)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", default="out/sample-corpus/train/*.jsonl.zst")
    p.add_argument("--tokenizer", default="../shared/data/tokenizers/llama2-bpe-32k.model")
    p.add_argument("--chunks", type=int, default=120_000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--save-every", type=int, default=8192)
    p.add_argument("--out-dir", default="out/bench")
    args = p.parse_args(argv)
    texts, doc_ids, chunk_index = chunk_corpus(args.input, args.tokenizer, args.chunks)
    out = os.path.join(args.out_dir, f"minilm-{cache_key(args.input, args.tokenizer)}.npz")
    print(f"{len(texts):,} chunks of {CHUNK_LEN} tokens from {doc_ids[-1] + 1:,} documents -> {out}", flush=True)
    done = np.zeros((0, 384), np.float32)
    if os.path.exists(out):
        done = np.load(out)["vectors"]
    import torch  # noqa: PLC0415

    from transforms.retrieval import retrieval_encoders  # noqa: PLC0415

    torch.set_num_threads(args.threads)
    model = retrieval_encoders.load_minilm("cpu")
    parts = [done]
    t0, n0 = time.perf_counter(), len(done)
    pos = len(done)
    while pos < len(texts):
        end = min(len(texts), pos + args.save_every)
        parts.append(retrieval_encoders.minilm_encode(model, texts[pos:end], args.batch_size))
        pos = end
        vecs = np.concatenate(parts)
        tmp = out + ".tmp.npz"
        np.savez(tmp, vectors=vecs, doc_ids=doc_ids[:pos], chunk_index=chunk_index[:pos])
        os.replace(tmp, out)
        rate = (pos - n0) / (time.perf_counter() - t0)
        print(f"{pos:,}/{len(texts):,} encoded, {rate:.1f} chunks/s on {args.threads} threads", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
