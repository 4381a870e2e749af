"""Exactness and speed of the fast tokenizer backends against SentencePiece, on the same documents in one run.

    PYTHONPATH=. python bench/tokenizer_backend_bench.py --model ../shared/data/tokenizers/llama2-bpe-32k.model \
        --inputs /tmp/sample/*.jsonl.zst /tmp/sample/train/*.jsonl.zst ../shared/data/other/*

Reads every document of the inputs (Pile-format .jsonl / .jsonl.zst / .json.gz / .jsonl.gz, `text` field) plus
hand-made edge cases, checks each backend's ids against `sp.encode(text)` on every document, then times
SentencePiece (1 thread, per document: the reference), each backend per document on 1 thread, the batch APIs,
and each backend called from 2 Python threads (does it release the GIL? Beam's multi_threading mode runs two
worker threads in one process). Rates are tokens per second of wall time; ratios are against SentencePiece's.
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transforms import tokenizer_backends as tb  # noqa: E402

EDGE_CASES = [
    "<s>hello</s> <unk> <pad> [INST] x", "<0x0A> <0x41>", "\u200b\ufeff\U0001f600 ünïcödé\r\n\t",
    "日本語のテキスト、中文文本，한국어", "\x00\x01\x07\x1b[31m\x7f", "a\u00a0b\u2009c\u3000d", "ﬁ ① ｆｕｌｌ",
    "", " ", "  ", "\n", "\r\n\r\n", "▁▁x ▁", "\t\t  \n  x  ", "e\u0301 é", "🏳️‍🌈👨‍👩‍👧", "\ud7ff\ue000\U0010ffff",
]


def _lines(path: str):
    if path.endswith(".zst"):
        import zstandard

        with open(path, "rb") as f:
            data = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True).read()
    elif path.endswith(".gz"):
        data = gzip.open(path, "rb").read()
    else:
        data = open(path, "rb").read()
    return io.BytesIO(data).read().splitlines()


def load_texts(paths: list) -> list:
    texts = []
    for path in paths:
        for line in _lines(path):
            if not line.strip():
                continue
            try:
                text = json.loads(line).get("text")
            except (ValueError, AttributeError):
                continue
            if isinstance(text, str):
                texts.append(text)
    return texts + EDGE_CASES


def _rate(fn, texts, tokens: int, repeat: int = 2) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(texts)
        best = min(best, time.perf_counter() - t0)
    return tokens / best


def _two_threads(per_doc):
    def run(texts):
        halves = [texts[0::2], texts[1::2]]
        threads = [threading.Thread(target=lambda h=h: [per_doc(t) for t in h]) for h in halves]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return run


def _two_threads_batch(batch_fn, size: int = 64):
    def run(texts):
        halves = [texts[0::2], texts[1::2]]

        def work(h):
            for i in range(0, len(h), size):
                batch_fn(h[i:i + size])
        threads = [threading.Thread(target=work, args=(h,)) for h in halves]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--inputs", nargs="+", required=True)
    p.add_argument("--max-chars", type=int, default=1 << 20, help="skip longer texts (FAST_BACKEND_MAX_CHARS)")
    args = p.parse_args()
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=args.model)
    model_bytes = open(args.model, "rb").read()
    texts = [t for t in load_texts(args.inputs) if len(t) <= args.max_chars]
    want = [sp.encode(t, out_type=int) for t in texts]
    tokens = sum(map(len, want))
    print(f"{len(texts):,} documents, {sum(map(len, texts)):,} characters, {tokens:,} tokens")

    encoders = {}
    for name, cls in (("splintr", tb.SplintrEncoder), ("kitoken", tb.KitokenEncoder)):
        try:
            encoders[name] = cls(model_bytes, sp, spot_check_every=0)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"{name}: cannot load ({e})")
    for name, enc in encoders.items():
        bad = [i for i, t in enumerate(texts) if enc.encode(t) != want[i]]
        print(f"{name}: {len(texts) - len(bad):,}/{len(texts):,} documents identical to sp.encode"
              + (f"; differs on {[texts[i][:60] for i in bad[:5]]}" if bad else ""))

    runs = {"sentencepiece, per doc, 1 thread": lambda ts: [sp.encode(t, out_type=int) for t in ts],
            "sentencepiece, 2 Python threads": _two_threads(lambda t: sp.encode(t, out_type=int))}
    if "splintr" in encoders:
        s = encoders["splintr"]._tok
        runs["splintr encode_ordinary, per doc, 1 thread"] = lambda ts: [s.encode_ordinary(t) for t in ts]
        runs["splintr encode_ordinary, 2 Python threads"] = _two_threads(s.encode_ordinary)
        runs["splintr encode_batch (rayon), 1 call"] = lambda ts: [s.encode_batch(ts[i:i + 64])
                                                                   for i in range(0, len(ts), 64)]
        runs["splintr encode_batch x64, 2 Python threads"] = _two_threads_batch(s.encode_batch)
        runs["SplintrEncoder.encode x64 (as the job), 1 thread"] = lambda ts: [
            encoders["splintr"].encode(ts[i:i + 64]) for i in range(0, len(ts), 64)]
        runs["SplintrEncoder.encode x64, 2 Python threads"] = _two_threads_batch(encoders["splintr"].encode)
    if "kitoken" in encoders:
        k = encoders["kitoken"]._kt
        runs["kitoken, per doc, 1 thread"] = lambda ts: [k.encode(t, False) for t in ts]
        runs["kitoken, 2 Python threads"] = _two_threads(lambda t: k.encode(t, False))
    ref = None
    for label, fn in runs.items():
        rate = _rate(fn, texts, tokens)
        ref = ref or rate
        print(f"{label:55s} {rate / 1e6:6.2f} M tokens/s  {rate / ref:5.2f}x sentencepiece")


if __name__ == "__main__":
    main()
