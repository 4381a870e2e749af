"""Exactness and speed of the fast tokenizer backends against each format's reference library, in one run.

    PYTHONPATH=. python bench/tokenizer_backend_bench.py \
        --tokenizer ../shared/data/tokenizers/llama2-bpe-32k.model out/tokenizer/hf-bpe-8k/tokenizer.json \
        --inputs ../shared/data/pile/* ../shared/data/other/* out/sample-corpus/train/*.jsonl.zst --time-docs 400

Reads every document of the inputs (Pile-format .jsonl / .jsonl.zst / .json.gz / .jsonl.gz, `text` field) plus
paragraphs of them and hand-made edge cases (special tokens written as text among them); for each tokenizer
(any format pileprep reads: the reference is sentencepiece, HF `tokenizers` or tiktoken) checks every backend
that loads it against the reference on every document, then times the reference per document on 1 thread and
each backend as the job calls it (`encode` on batches of 64, 1 thread). Ratios are to the reference, same run.

Measured (2-core shared machine, 4,933 documents: ../shared/data and an 8 MB sample corpus; timing on all,
best of 3, load 4.4; hf-bpe-8k: `pileprep tokenizer train --kind hf-bpe --vocab-size 8000` on the corpus; the
table and the spot check's cost are in docs/BENCHMARKS.md):
  Llama 2 (32k BPE): sentencepiece 0.94 M tok/s; kitoken 2.4x, splintr 4.2x, gigatoken 25.7x (wall; CPU: 3.1x,
  4.6x, 23.2x); 0 documents differ for each.
  hf-bpe-8k tokenizer.json: HF tokenizers `encode` 0.29 M tok/s; gigatoken 98x (wall) / 73x (CPU); 0 differ.
  hf-bpe-8k .tiktoken: tiktoken `encode_ordinary` 1.68 M tok/s (the only backend).
"""
from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transforms.tokenize import references, tokenizer  # noqa: E402
from transforms.tokenize import tokenizer_backends as tb  # noqa: E402
from transforms.tokenize.formats import TokenizerOptions  # noqa: E402

EDGE_CASES = [
    "<s>hello</s> <unk> <pad> [INST] x", "<|endoftext|> x<|padding|>y <|endoftext|><|endoftext|>", "<0x0A> <0x41>", "\u200b\ufeff\U0001f600 ünïcödé\r\n\t",
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
                if "naughty" in os.path.basename(path):  # each naughty string alone, too
                    texts += text.splitlines()
    return list(dict.fromkeys(texts + EDGE_CASES))  # distinct documents, first-seen order


def _rate(fn, texts, tokens: int, repeat: int = 2) -> tuple:
    """(tokens per second of wall time, per CPU-second of the whole process), best of `repeat`. CPU-seconds are
    the steadier figure on a shared machine; wall time is what two threads gain when the call releases the GIL."""
    wall = cpu = float("inf")
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(texts)
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return tokens / wall, tokens / cpu


def _encoders(data: bytes, ref) -> dict:
    """Every fast backend that loads this tokenizer (the job's classes, spot checks off)."""
    out = {}
    kind = references.format_of(ref)
    for name, (cls, _dist) in tb._ENCODERS.items():  # noqa: SLF001 - the job's own table of backends
        if (name, kind) not in tb.SPOT_CHECK_EVERY:
            continue
        try:
            out[name] = cls(data, ref, spot_check_every=0)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"  {name}: cannot load ({e})")
    return out


def bench_one(path: str, options: TokenizerOptions, texts: list, time_docs: int, repeat: int) -> dict:
    """Parity of every backend with the format's reference on all `texts`, then tokens/s per thread of the
    reference and of each backend (the job's call: `encode` on batches of 64 documents) on `time_docs` of them."""
    data = tokenizer.read_model_bytes(path)
    ref = tokenizer.load_processor(data, path, options)
    kind = references.format_of(ref)
    t0 = time.perf_counter()
    want = [tb._as_list(w) for w in ref.encode(texts, out_type=int, num_threads=os.cpu_count() or 1)]
    print(f"{path} ({kind}, vocabulary {ref.get_piece_size():,}): reference {tb.REFERENCE_NAMES[kind]}; "
          f"{len(texts):,} documents, {sum(map(len, want)):,} tokens ({time.perf_counter() - t0:.1f} s)")
    encoders = _encoders(data, ref)
    result = {"tokenizer": path, "format": kind, "documents": len(texts), "backends": {}}
    for name, enc in encoders.items():
        bad = [i for i, t in enumerate(texts) if tb._as_list(enc.encode(t)) != want[i]]
        result["backends"][name] = {"mismatching_documents": len(bad)}
        print(f"  {name}: {len(bad):,} of {len(texts):,} documents differ from {tb.REFERENCE_NAMES[kind]}"
              + (f": {[texts[i][:60] for i in bad[:5]]}" if bad else ""))
    step = max(1, len(texts) // max(time_docs, 1)) if time_docs else 1
    sub, sub_want = texts[::step][:time_docs or None], want[::step][:time_docs or None]
    tokens = sum(map(len, sub_want))
    runs = {f"{tb.REFERENCE_NAMES[kind]} (reference), per document": lambda ts: [ref.encode(t) for t in ts]}
    runs_checked = {}
    for name, enc in encoders.items():
        runs[f"{name} (the job's call), batches of 64"] = (
            lambda ts, enc=enc: [enc.encode(ts[i:i + 64]) for i in range(0, len(ts), 64)])
        every = tb.SPOT_CHECK_EVERY[name, kind]  # the workers' encoder: the same call, spot-checked 1 in N
        checked = runs_checked[name] = type(enc)(data, ref, spot_check_every=every)
        runs[f"{name} + spot check 1 in {every}"] = (
            lambda ts, enc=checked: [enc.encode(ts[i:i + 64]) for i in range(0, len(ts), 64)])
    print(f"  timing on {len(sub):,} documents, {tokens:,} tokens, 1 thread")
    print(f"  {'':48s} {'M tok/s':>8s} {'ratio':>6s} {'M tok/CPU-s':>12s} {'ratio':>6s}")
    base = None
    for label, fn in runs.items():
        wall, cpu = _rate(fn, sub, tokens, repeat)
        base = base or (wall, cpu)
        print(f"  {label:48s} {wall / 1e6:8.2f} {wall / base[0]:6.2f} {cpu / 1e6:12.2f} {cpu / base[1]:6.2f}")
        name = label.split(" ")[0]
        if "spot check" in label:
            plain = result["backends"][name]["ratio_cpu"]
            result["backends"][name]["spot_check_cpu_cost"] = round(plain / (cpu / base[1]) - 1, 3)
            c = runs_checked[name].counts  # summed over the repeats: the shares are the same each time
            share_docs, share_bytes = c["checked_documents"] / c["documents"], c["checked_bytes"] / c["bytes"]
            result["backends"][name].update(spot_check_document_share=round(share_docs, 5),
                                            spot_check_byte_share=round(share_bytes, 5))
            print(f"  {'':48s} spot check: +{100 * result['backends'][name]['spot_check_cpu_cost']:.1f}% CPU, "
                  f"{100 * share_docs:.2f}% of documents, {100 * share_bytes:.2f}% of bytes re-encoded")
        elif name in result["backends"]:
            result["backends"][name].update(ratio_wall=round(wall / base[0], 2), ratio_cpu=round(cpu / base[1], 2))
        else:
            result["reference_tokens_per_s"] = round(wall)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", nargs="+", required=True, help="tokenizer files (any format pileprep reads)")
    p.add_argument("--tokenizer-pattern", default="", help="for tiktoken files")
    p.add_argument("--special-tokens", default="", help="for tiktoken files")
    p.add_argument("--inputs", nargs="+", required=True)
    p.add_argument("--max-chars", type=int, default=1 << 20, help="skip longer texts (FAST_BACKEND_MAX_CHARS)")
    p.add_argument("--time-docs", type=int, default=1000, help="time on this many documents, evenly spread (0: all)")
    p.add_argument("--repeat", type=int, default=2, help="best of this many timings")
    p.add_argument("--paragraphs", type=int, default=4000,
                   help="also this many paragraphs of the documents as documents of their own (short documents, "
                        "each with its own start: the dummy prefix), evenly spread")
    p.add_argument("--json", default="", help="write the figures here too")
    args = p.parse_args()
    texts = load_texts(args.inputs)
    paragraphs = [p for t in texts for p in t.split("\n\n") if p.strip()]
    step = max(1, len(paragraphs) // max(args.paragraphs, 1))
    texts = list(dict.fromkeys(texts + paragraphs[::step][:args.paragraphs]))
    texts = [t for t in texts if len(t) <= args.max_chars]
    results = []
    for path in args.tokenizer:
        options = TokenizerOptions(args.tokenizer_pattern, args.special_tokens)
        results.append(bench_one(path, options, texts, args.time_docs, args.repeat))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
