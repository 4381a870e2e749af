"""Shuffle cost at corpus scale, computed from the plan (nothing is run): requests and bytes moved between the
tokenize stage and the pack stage, for today's file-spill design and the alternatives, 1 GB → 1 TB of text.

Inputs are the shard job's own sizing rules (32 MiB units of raw text, 1 GiB shards at ~6 bytes per token on
disk, uint16 spill tokens, a 48-byte index row per document) and Pile-like text (~4 bytes of text per Llama 2
token, ~4.3 KB per document: 825 GiB / ~210 M documents).

Designs:
- today (A): every pack task binary-searches every unit's index (each probe a seek + 8-byte read) and reads one
  token range from each unit: units × shards × (2·log2(docs/unit) + 2) requests. On an object store each probe
  outside the reader's buffer is a ranged GET; with a whole-index read instead, each pack task moves every
  unit's whole index.
- (A') today with each index read whole (Beam's buffered reader): units × shards × 2 requests, but the index
  bytes move once per shard: units × shards × index size.
- offsets (B): the tokenize stage returns, per unit, the offset of each of 4,096 fine key buckets per split
  (a 32 KiB table in the element, no file); the plan computes every pack task's exact ranges: units × shards
  ranged reads of tokens + index rows, no searches. Bytes = data once.
- two-level (C): each unit writes its sorted documents in G = ceil(sqrt(shards)) key-range sections; G merge
  tasks read their section from every unit and write one merged run per group; each pack task reads its
  range from its group's run: units × G + shards requests, data moved twice.
- runner shuffle (D, as built: `--shuffle runner`, pipeline/shard/runner_shuffle.py): once the plan knows the
  shard count, each unit's spill is read whole (index + tokens: 2 requests per unit) and cut into
  ((split, shard), piece) elements for a GroupByKey; the runner's shuffle (Dataflow Shuffle, Flink/Spark)
  moves them with its own batching (counted here as one write and one read per 64 MiB of shuffled data).
  Bytes = the spill read once + shuffled once. Only for distributed runners: FnApiRunner buffers a whole
  GroupByKey in memory, so locally the file spill stays (`--shuffle auto`).

    python bench/shuffle_sim.py [--bytes-per-token 4.0] [--doc-kb 4.3]
"""
from __future__ import annotations

import argparse
import math

UNIT_BYTES = 32 << 20
SHARD_BYTES = 1 << 30
DISK_BYTES_PER_TOKEN = 6.0   # serialized Example bytes per token (pipeline/config.py BYTES_PER_TOKEN_ESTIMATE)
SPILL_BYTES_PER_TOKEN = 2    # uint16 token ids in the spill
INDEX_ROW = 48               # transforms/shard/spill.py INDEX_DTYPE
BUCKETS = 4096
SHUFFLE_BATCH = 64 << 20


def plan(text_bytes: float, bytes_per_token: float, doc_bytes: float) -> dict:
    tokens = text_bytes / bytes_per_token
    units = max(1, math.ceil(text_bytes / UNIT_BYTES))
    shards = max(1, math.ceil(tokens * DISK_BYTES_PER_TOKEN / SHARD_BYTES))
    docs_per_unit = max(1.0, UNIT_BYTES / doc_bytes)
    spill = tokens * SPILL_BYTES_PER_TOKEN + (text_bytes / doc_bytes) * INDEX_ROW
    index_bytes = docs_per_unit * INDEX_ROW
    pairs = units * shards
    probes = 2 * math.ceil(math.log2(docs_per_unit + 1))
    g = math.ceil(math.sqrt(shards))
    return {
        "units": units, "shards": shards, "spill_gb": spill / 1e9,
        "A_requests": pairs * (probes + 2), "A_bytes": spill, "A_bytes_per_req": spill / (pairs * (probes + 2)),
        "A2_requests": pairs * 2, "A2_bytes": pairs * index_bytes + tokens * SPILL_BYTES_PER_TOKEN,
        "B_requests": pairs * 2, "B_bytes": spill, "B_bytes_per_req": spill / (pairs * 2),
        "C_requests": units * g + g + shards, "C_bytes": 2 * spill, "C_bytes_per_req": 2 * spill / (units * g + g + shards),
        "D_requests": 2 * units + math.ceil(spill / SHUFFLE_BATCH) * 2, "D_bytes": 2 * spill,
        "D_bytes_per_req": 2 * spill / (2 * units + math.ceil(spill / SHUFFLE_BATCH) * 2),
    }


def _n(x: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes-per-token", type=float, default=4.0)
    ap.add_argument("--doc-kb", type=float, default=4.3)
    args = ap.parse_args()
    print("| corpus | units | shards | spill | A today: requests (bytes/req) | A' whole-index reads: requests, "
          "bytes moved | B offsets: requests (bytes/req) | C two-level: requests (bytes/req), bytes | "
          "D runner shuffle: requests (bytes/req), bytes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for gb in (1, 10, 100, 1000):
        p = plan(gb * 1e9, args.bytes_per_token, args.doc_kb * 1e3)
        print(f"| {gb} GB | {p['units']:,} | {p['shards']:,} | {p['spill_gb']:.2f} GB "
              f"| {_n(p['A_requests'])} ({_n(p['A_bytes_per_req'])}B) "
              f"| {_n(p['A2_requests'])}, {_n(p['A2_bytes'])}B "
              f"| {_n(p['B_requests'])} ({_n(p['B_bytes_per_req'])}B) "
              f"| {_n(p['C_requests'])} ({_n(p['C_bytes_per_req'])}B), {_n(p['C_bytes'])}B "
              f"| {_n(p['D_requests'])} ({_n(p['D_bytes_per_req'])}B), {_n(p['D_bytes'])}B |")


if __name__ == "__main__":
    main()
