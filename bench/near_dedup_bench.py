"""Near-dedup quality and cost, measured in one run (the real `pileprep shard --near-dedup` CLI throughout).

    python bench/near_dedup_bench.py [--docs 3000] [--planted 400] [--distinct-mb 6] [--tokenizer MODEL]

1. quality: a corpus of at most 5k documents — stdlib source cut into documents, the real sample files of
   ../shared/data (the "mini sample"), and `--planted` near-copies made by seeded edits: adjacent word swaps,
   an inserted header, whitespace and case changes, and truncations at known Jaccard levels (0.95 ... 0.5).
   Ground truth: the exact Jaccard of the shingle sets (transforms/shard/near_dedup/shingling.py `shingles`) of every
   pair, computed here as a sparse product (documents x shingles). The job's sidecar says what it removed:
   recall = pairs at J >= 0.9 of which at least one document was removed; precision = removed documents whose
   best partner has J >= 0.7 (a removal with no partner that close is a false positive). With `--shingles
   tokens` the job runs with --near-dedup-shingles tokens and is scored against the word truth above (the
   targets' truth: near-duplicate text as a reader means it) and, beside it, the Jaccard of token n-grams;
2. cost: seeded random-word documents (distinct text: no near-copies, so the near-dedup stage pays its full
   price and removes nothing), `--distinct-mb` (1x) and 4x; the shard job's CPU seconds (user + sys of the
   whole process) without and with --near-dedup at 1x and 4x (the marginal share: what grows with the input),
   and peak RSS (ru_maxrss from wait4) with --near-dedup at
   1x and 4x. The default runner (FnApiRunner, one worker thread per core) keeps the job in one process.

3. sketches side by side (`--sketches`, same run): the job's pure logic (transforms/shard/near_dedup/:
   shingles, signatures, band buckets, star edges, label propagation) in this process on the quality corpus,
   once per sketch (one-permutation hashing, the default, and 100-permutation MinHash), scored against the same
   ground truth; and the CPU seconds of the signature step alone, per sketch, on the distinct text.

Output ends with a markdown table for docs/NEAR_DEDUP.md.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import numpy as np  # noqa: E402
import zstandard  # noqa: E402

from tests.conftest import SHARED_DATA, stdlib_texts  # noqa: E402
from transforms.io.read_records import RawRecord, compression_of, iter_raw_records  # noqa: E402
from transforms.shard.near_dedup import clusters, minhash, shingling  # noqa: E402
from transforms.shard.documents import Document, document_id, parse_record  # noqa: E402

TOKENIZER = os.path.join(REPO, "out", "tokenizer", "sample-8k.model")
TRUNCATIONS = (0.95, 0.9, 0.8, 0.7, 0.6, 0.5)
# The quality run needs no speed: one in-memory worker. With worker threads, FnApiRunner failed this run now
# and then on a loaded machine ("Invalid PaneInfoEncoding" decoding a grouped stage's input; not reproduced in
# three in-process runs): see docs/NEAR_DEDUP.md.
QUALITY_RUNNER = ("--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory")
EDITS = ("swap", "header", "case_space") + tuple(f"truncate_{t}" for t in TRUNCATIONS)


# ------------------------------------------------------------------------------------------------ corpora
def base_documents(limit: int) -> list:
    """(text, source): the shared sample files first, then stdlib source cut into ~3,000-char documents."""
    docs = []
    for sub in ("pile", "other"):
        folder = os.path.join(SHARED_DATA, sub)
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                for rec in iter_raw_records(f, compression_of(path), 1 << 26):
                    if isinstance(rec, RawRecord):
                        doc = parse_record(rec.data, "text", ("meta.pile_set_name",))
                        if isinstance(doc, Document):
                            docs.append((doc.text, "sample:" + name))
    for _name, text in stdlib_texts(40_000_000):
        cur = ""
        for line in text.splitlines(keepends=True):
            cur += line
            if len(cur) >= 3000:
                docs.append((cur, "stdlib"))
                cur = ""
        if len(docs) >= 3 * limit:
            break
    seen, out = set(), []
    for text, source in docs:  # distinct ids and at least 30 words, so every document has real shingles
        i = document_id(text)
        if i not in seen and len(shingling.normalised_words(text)) >= 30:
            seen.add(i)
            out.append((text, source))
    return out[:limit]


def edit(text: str, kind: str, rng: random.Random) -> str:
    words = text.split()
    if kind == "swap":  # ~2% of adjacent word pairs swapped
        for _ in range(max(1, len(words) // 50)):
            i = rng.randrange(len(words) - 1)
            words[i], words[i + 1] = words[i + 1], words[i]
        return " ".join(words)
    if kind == "header":
        return f"Mirrored from archive {rng.randrange(10**6)} -- retrieved 2021-03-0{rng.randrange(1, 9)}\n\n" + text
    if kind == "case_space":
        return "  ".join(w.upper() if rng.random() < 0.5 else w for w in words) + "\n\n"
    level = float(kind.split("_")[1])  # truncation: the copy keeps a prefix; J = its shingles / all shingles
    n = len(shingling.normalised_words(text))
    shingles_all = max(1, n - shingling.SHINGLE_WORDS + 1)
    keep_words = int(round(level * shingles_all)) + shingling.SHINGLE_WORDS - 1
    kept = shingling.normalised_words(text)[:keep_words]
    return " ".join(kept)


def planted_corpus(n_docs: int, n_planted: int, seed: int) -> tuple:
    rng = random.Random(seed)
    base = base_documents(n_docs - n_planted)
    planted = []
    for k, idx in enumerate(rng.sample(range(len(base)), min(n_planted, len(base)))):
        kind = EDITS[k % len(EDITS)]
        text = edit(base[idx][0], kind, rng)
        planted.append((text, base[idx][1], kind, document_id(base[idx][0])))
    return base, planted


def distinct_corpus(path: str, mb: float, seed: int) -> None:
    """Seeded random-word documents (Zipf vocabulary of 50k made-up words): no two are near each other."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, size=int(rng.integers(2, 10)))) for _ in range(50_000)]
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    weights /= weights.sum()
    target, written = int(mb * 1e6), 0
    cctx = zstandard.ZstdCompressor(level=1)
    with open(path, "wb") as f, cctx.stream_writer(f) as out:
        while written < target:
            n = int(rng.integers(200, 1500))
            text = " ".join(vocab[i] for i in rng.choice(len(vocab), size=n, p=weights))
            line = json.dumps({"text": text, "meta": {"pile_set_name": "Distinct"}}).encode() + b"\n"
            out.write(line)
            written += len(line)


def write_jsonl_zst(path: str, docs: list) -> None:
    cctx = zstandard.ZstdCompressor(level=3)
    with open(path, "wb") as f:
        f.write(cctx.compress(b"".join(json.dumps({"text": t, "meta": {"pile_set_name": s}}).encode() + b"\n"
                                       for t, s in docs)))


# ---------------------------------------------------------------------------------------------- running
def run_shard(inputs: str, output: str, tokenizer: str, *extra) -> dict:
    """The CLI in a fresh process; (wall s, CPU s of the process tree, peak RSS MiB of the largest process)."""
    argv = [sys.executable, "-m", "pipeline.cli", "shard", "--input", inputs, "--output", output, "--tokenizer",
            tokenizer, "--seq-len", "1024", "--num-shards", "2", "--unit-mb", "2", "--progress-every", "0", *extra]
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", PYTHONPATH=REPO)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    err = proc.stderr.read().decode(errors="replace")
    proc.stdout.read()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"shard failed ({proc.returncode}): {err[-3000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_rss_mib": usage.ru_maxrss / 1024}


def removed_by_job(output: str) -> dict:
    manifest = json.load(open(os.path.join(output, "manifest.json")))
    rows = {}
    for f in manifest["near_dedup"]["sidecars"]:
        with open(os.path.join(output, f["path"])) as fh:
            for line in fh:
                r = json.loads(line)
                rows[r["id"]] = r
    return rows


# ------------------------------------------------------------------------------------------ ground truth
def token_ids(texts: list, tokenizer_path: str) -> list:
    """Each text's token ids by the format's reference encoder (the ids every exact backend gives the job)."""
    from transforms.tokenize import tokenizer  # noqa: PLC0415

    sp = tokenizer.load_processor(tokenizer.read_model_bytes(tokenizer_path), tokenizer_path)
    return tokenizer.encode_batch(sp, texts)


def shingle_sets(texts: list, kind: str, ids: list = None) -> list:
    """Sorted unique shingles of each text as the job computes them for --near-dedup-shingles `kind`."""
    if kind == "tokens":
        return shingling.token_shingles_batch(ids, shingling.SHINGLE_TOKENS)
    return [shingling.shingles(t) for t in texts]


def all_pairs_jaccard(texts: list, floor: float = 0.5, sets: list = None) -> tuple:
    """(pairs [(i, j, J)] with J >= floor, best partner J per document) over every pair, exactly; J of the word
    shingles unless `sets` (another kind's shingles of the same texts) is given."""
    from scipy import sparse  # noqa: PLC0415

    sets = sets if sets is not None else [shingling.shingles(t) for t in texts]
    flat = np.concatenate(sets)
    uniq, inverse = np.unique(flat, return_inverse=True)
    rows = np.repeat(np.arange(len(sets)), [s.size for s in sets])
    a = sparse.csr_matrix((np.ones(flat.size, np.float32), (rows, inverse)), shape=(len(sets), uniq.size))
    inter = (a @ a.T).tocoo()
    sizes = np.array([s.size for s in sets], dtype=np.float64)
    mask = inter.row < inter.col
    i, j, v = inter.row[mask], inter.col[mask], inter.data[mask]
    jac = v / (sizes[i] + sizes[j] - v)
    best = np.zeros(len(sets))
    np.maximum.at(best, i, jac)
    np.maximum.at(best, j, jac)
    keep = jac >= floor
    return list(zip(i[keep].tolist(), j[keep].tolist(), jac[keep].tolist())), best


def removed_in_process(texts: list, ids: list, params: minhash.MinHashParams,
                       threshold: float = minhash.DEFAULT_THRESHOLD) -> set:
    """The ids the job's logic removes from `texts` (all train), computed here without Beam."""
    sigs = minhash.signatures([shingling.shingles(t) for t in texts], params)
    keys = minhash.band_keys(sigs, params) >> np.uint64(1)
    buckets: dict = {}
    for doc_id, sig, ks in zip(ids, sigs, keys):
        node = clusters.Node(clusters.rank(0, doc_id), doc_id, 0, sig.tobytes())
        for k in ks.tolist():
            buckets.setdefault(k, []).append(node)
    edges = [e for members in buckets.values() if len(members) > 1
             for e in clusters.bucket_edges(members, threshold)]
    labels, converged = clusters.components(edges, rounds=50)
    assert converged
    return {d for d, (node, keeper) in labels.items() if keeper.doc_id != node.doc_id}


def score(gone: np.ndarray, pairs: list, best: np.ndarray) -> dict:
    high = [(i, j) for i, j, v in pairs if v >= 0.9]
    fp = int(np.sum(gone & (best < 0.7)))
    return {"removed": int(gone.sum()), "recall_j_ge_0.9": round(sum(1 for i, j in high if gone[i] or gone[j])
                                                                / max(1, len(high)), 4),
            "false_positives_below_0.7": fp, "precision_below_0.7": round(1 - fp / max(1, int(gone.sum())), 4)}


def compare_sketches(docs: list, pairs: list, best: np.ndarray, distinct_path: str, seed: int) -> dict:
    texts = [t for t, _ in docs]
    ids = [document_id(t) for t in texts]
    with open(distinct_path, "rb") as f:
        distinct = [json.loads(line)["text"] for line in zstandard.ZstdDecompressor().stream_reader(f).read()
                    .splitlines()]
    mb = sum(len(t) for t in distinct) / 1e6
    t0 = time.process_time()
    sets = [shingling.shingles(t) for t in distinct]
    shingle_s = time.process_time() - t0
    out = {"distinct_mb": round(mb, 2), "shingles_cpu_s_per_mb": round(shingle_s / mb, 3)}
    for sketch in minhash.SKETCHES:
        params = minhash.MinHashParams(seed=seed, sketch=sketch)
        removed = removed_in_process(texts, ids, params)
        t0 = time.process_time()
        minhash.signatures(sets, params)
        sign_s = time.process_time() - t0
        out[sketch] = {**score(np.array([i in removed for i in ids]), pairs, best),
                       "signatures_cpu_s_per_mb": round(sign_s / mb, 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=3000, help="documents in the quality corpus (at most 5000)")
    ap.add_argument("--planted", type=int, default=450)
    ap.add_argument("--distinct-mb", type=float, default=6.0)
    ap.add_argument("--tokenizer", default=TOKENIZER)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-cost", action="store_true")
    ap.add_argument("--skip-job-quality", action="store_true", help="no CLI quality run (the sketches still run)")
    ap.add_argument("--sketches", action="store_true", help="score both sketches in this process, same truth")
    ap.add_argument("--shingles", choices=shingling.SHINGLE_KINDS, default=shingling.DEFAULT_SHINGLES,
                    help="the job's --near-dedup-shingles; with tokens the removals are scored against both "
                    "ground truths: Jaccard of word 5-grams (what a reader calls near-duplicate text, the targets' "
                    "truth) and of token n-grams (what the option measures)")
    args = ap.parse_args()
    if args.docs > 5000:
        raise SystemExit("--docs: at most 5000 (every pair is compared exactly)")
    work = tempfile.mkdtemp(prefix="near-dedup-bench-")
    results = {}

    base, planted = planted_corpus(args.docs, args.planted, args.seed)
    docs = [(t, s) for t, s in base] + [(t, s) for t, s, _k, _o in planted]
    os.makedirs(os.path.join(work, "quality"))
    write_jsonl_zst(os.path.join(work, "quality", "docs.jsonl.zst"), docs)
    t0 = time.monotonic()
    pairs, best = all_pairs_jaccard([t for t, _ in docs])
    print(f"ground truth: {len(docs)} documents, {len(docs) * (len(docs) - 1) // 2:,} pairs, "
          f"{sum(1 for p in pairs if p[2] >= 0.9)} at J >= 0.9, in {time.monotonic() - t0:.1f}s", flush=True)
    ids = [document_id(t) for t, _ in docs]
    if args.sketches:
        folder = os.path.join(work, "sketch-distinct")
        os.makedirs(folder)
        distinct_corpus(os.path.join(folder, "d.jsonl.zst"), args.distinct_mb, args.seed + 7)
        results["sketches"] = compare_sketches(docs, pairs, best, os.path.join(folder, "d.jsonl.zst"), args.seed)
        print(json.dumps(results["sketches"], indent=1), flush=True)
    if not args.skip_job_quality:
        job_quality(args, work, docs, planted, base, ids, pairs, best, results)
        if args.shingles == "tokens":
            t_pairs, t_best = all_pairs_jaccard([t for t, _ in docs], sets=shingle_sets(
                [], "tokens", token_ids([t for t, _ in docs], args.tokenizer)))
            removed = removed_by_job(os.path.join(work, "quality-out"))
            results["quality_token_truth"] = {
                "pairs_j_ge_0.9": sum(1 for p in t_pairs if p[2] >= 0.9),
                **score(np.array([i in removed for i in ids]), t_pairs, t_best)}
            print(json.dumps(results["quality_token_truth"], indent=1), flush=True)
    if not args.skip_cost:
        cost_run(args, work, results)
    print_table(args, results)


def job_quality(args, work, docs, planted, base, ids, pairs, best, results) -> None:
    q = run_shard(os.path.join(work, "quality", "*"), os.path.join(work, "quality-out"), args.tokenizer,
                  "--near-dedup", "--near-dedup-shingles", args.shingles, "--val-fraction", "0", "--test-fraction",
                  "0", *QUALITY_RUNNER)
    removed = removed_by_job(os.path.join(work, "quality-out"))
    gone = np.array([i in removed for i in ids])
    high = [(i, j) for i, j, v in pairs if v >= 0.9]
    recall = sum(1 for i, j in high if gone[i] or gone[j]) / max(1, len(high))
    fp = int(np.sum(gone & (best < 0.7)))
    precision = 1 - fp / max(1, int(gone.sum()))
    per_edit = {}
    pos = {d: k for k, d in enumerate(ids)}
    for n, (_t, _s, kind, original) in enumerate(planted):
        copy = len(base) + n
        hit = bool(gone[copy] or gone[pos[original]])
        per_edit.setdefault(kind, []).append(hit)
    results["quality"] = {"documents": len(docs), "pairs_j_ge_0.9": len(high), "removed": int(gone.sum()),
                          "recall_j_ge_0.9": round(recall, 4), "false_positives_below_0.7": fp,
                          "precision_below_0.7": round(precision, 4), "job_wall_s": round(q["wall_s"], 1),
                          "planted_resolved": {k: f"{sum(v)}/{len(v)}" for k, v in per_edit.items()}}
    print(json.dumps(results["quality"], indent=1), flush=True)


def cost_run(args, work, results) -> None:
    for factor in (1, 4):
        folder = os.path.join(work, f"distinct-{factor}x")
        os.makedirs(folder)
        distinct_corpus(os.path.join(folder, "d.jsonl.zst"), args.distinct_mb * factor, args.seed + factor)
    cost = {}
    cost["1x_plain"] = run_shard(os.path.join(work, "distinct-1x", "*"), os.path.join(work, "o1p"),
                                 args.tokenizer)
    cost["1x_near_dedup"] = run_shard(os.path.join(work, "distinct-1x", "*"), os.path.join(work, "o1n"),
                                      args.tokenizer, "--near-dedup", "--near-dedup-shingles", args.shingles)
    cost["4x_plain"] = run_shard(os.path.join(work, "distinct-4x", "*"), os.path.join(work, "o4p"),
                                 args.tokenizer)
    cost["4x_near_dedup"] = run_shard(os.path.join(work, "distinct-4x", "*"), os.path.join(work, "o4n"),
                                      args.tokenizer, "--near-dedup", "--near-dedup-shingles", args.shingles)
    extra = cost["1x_near_dedup"]["cpu_s"] / cost["1x_plain"]["cpu_s"] - 1
    results["cost"] = {k: {m: round(x, 2) for m, x in v.items()} for k, v in cost.items()}
    results["cost"]["extra_cpu_share_1x"] = round(extra, 3)
    results["cost"]["extra_cpu_share_4x"] = round(cost["4x_near_dedup"]["cpu_s"] / cost["4x_plain"]["cpu_s"] - 1, 3)
    # the part that grows with the input: (4x - 1x extra CPU) over (4x - 1x plain CPU)
    results["cost"]["marginal_extra_cpu_share"] = round(
        ((cost["4x_near_dedup"]["cpu_s"] - cost["4x_plain"]["cpu_s"])
         - (cost["1x_near_dedup"]["cpu_s"] - cost["1x_plain"]["cpu_s"]))
        / (cost["4x_plain"]["cpu_s"] - cost["1x_plain"]["cpu_s"]), 3)
    results["cost"]["peak_rss_4x_over_1x"] = round(cost["4x_near_dedup"]["peak_rss_mib"]
                                                   / cost["1x_near_dedup"]["peak_rss_mib"], 3)
    print(json.dumps(results["cost"], indent=1), flush=True)


def print_table(args, results) -> None:
    print("\n| figure | value | target |\n|---|---|---|")
    for name, qr in [("job", results.get("quality"))] + [(k, results.get("sketches", {}).get(k))
                                                         for k in minhash.SKETCHES]:
        if not qr:
            continue
        print(f"| {name}: recall, pairs at J >= 0.9 | {qr['recall_j_ge_0.9']:.3f} | >= 0.95 |")
        print(f"| {name}: precision, removed docs with no partner at J >= 0.7 ({qr['removed']} removed) | "
              f"{qr['precision_below_0.7']:.3f} | >= 0.95 |")
        if "signatures_cpu_s_per_mb" in qr:
            print(f"| {name}: signature CPU s per MB of distinct text | {qr['signatures_cpu_s_per_mb']:.3f} | |")
    if "cost" in results:
        c = results["cost"]
        print(f"| extra CPU with --near-dedup, distinct text {args.distinct_mb:g} MB | "
              f"{100 * c['extra_cpu_share_1x']:.1f}% | <= 30% |")
        print(f"| extra CPU with --near-dedup, distinct text {4 * args.distinct_mb:g} MB | "
              f"{100 * c['extra_cpu_share_4x']:.1f}% | <= 30% |")
        print(f"| marginal extra CPU (grows with the input) | {100 * c['marginal_extra_cpu_share']:.1f}% | |")
        print(f"| peak RSS 4x / 1x with --near-dedup | {c['peak_rss_4x_over_1x']:.2f} | <= 1.1 |")


if __name__ == "__main__":
    main()
