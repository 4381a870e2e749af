"""Costs of the user-facing paths, each against its reference in the same run (the machine is shared and noisy).

  parquet read  : transforms/read_parquet rows/s  vs  read_records on the same documents as .jsonl.zst
  iterable ds   : ShardIterableDataset examples/s (DataLoader, 0 workers)  vs  bare read_records + decode_example
  export        : export_parquet examples/s  vs  the same bare read + decode
  report        : pileprep report seconds (manifest only)  vs  one pass of read + decode over the dataset

Usage: python bench/user_data_bench.py --dataset out/sample --corpus 'out/sample-corpus/train/*.jsonl.zst'
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

from model_contract import decode_example, load_manifest, read_records
from transforms.io.read_parquet import iter_parquet_records
from transforms.io.read_records import compression_of, iter_raw_records


def _timed(fn):
    t = time.perf_counter()
    n = fn()
    return n, time.perf_counter() - t


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dataset", default="out/sample")
    ap.add_argument("--corpus", default="out/sample-corpus/train/*.jsonl.zst")
    args = ap.parse_args(argv)
    out: dict = {}
    tmp = tempfile.mkdtemp(prefix="ud-bench-")

    paths = sorted(glob.glob(args.corpus))
    texts, sources = [], []
    for p in paths:
        with open(p, "rb") as f:
            for rec in iter_raw_records(f, compression_of(p)):
                d = json.loads(rec.data)
                texts.append(d["text"])
                sources.append(d["meta"]["pile_set_name"])
    pq_path = os.path.join(tmp, "corpus.parquet")
    pq.write_table(pa.table({"text": texts, "meta": [{"pile_set_name": s} for s in sources]}), pq_path,
                   row_group_size=256, compression="zstd")

    def read_jsonl():
        n = 0
        for p in paths:
            with open(p, "rb") as f:
                n += sum(1 for _ in iter_raw_records(f, compression_of(p)))
        return n

    def read_parquet():
        with open(pq_path, "rb") as f:
            return sum(1 for _ in iter_parquet_records(f, "text", ("meta.pile_set_name",), 256 << 20))

    n_json, t_json = _timed(read_jsonl)
    n_pq, t_pq = _timed(read_parquet)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    out["parquet_read"] = {"docs": n_pq, "text_MB": round(mb, 1), "jsonl_zst_MB_s": round(mb / t_json, 1),
                           "parquet_MB_s": round(mb / t_pq, 1), "parquet_over_jsonl_time": round(t_pq / t_json, 2)}
    assert n_json == n_pq

    m = load_manifest(args.dataset)
    shards = [os.path.join(args.dataset, s.path) for s in m.shards_for("train")]

    def bare():
        return sum(1 for p in shards for r in read_records(p) if decode_example(r) is not None)

    n_bare, t_bare = _timed(bare)
    from torch.utils.data import DataLoader  # noqa: PLC0415

    from trainer.iterable_dataset import ShardIterableDataset  # noqa: PLC0415

    ds = ShardIterableDataset(args.dataset, "train", batch_size=8, shuffle_shards=False)
    n_ds, t_ds = _timed(lambda: sum(len(b["index"]) for b in DataLoader(ds, batch_size=8, num_workers=0)))
    out["iterable_dataset"] = {"examples": n_ds, "bare_ex_s": round(n_bare / t_bare),
                               "dataset_ex_s": round(n_ds / t_ds),
                               "dataset_over_bare_time_per_example": round((t_ds / n_ds) / (t_bare / n_bare), 2)}

    from pipeline.tools.export import export_parquet  # noqa: PLC0415
    from pipeline.tools.report import write_report  # noqa: PLC0415

    res, t_exp = _timed(lambda: export_parquet(args.dataset, os.path.join(tmp, "export"), splits=("train",)))
    n_exp = sum(f["rows"] for f in res["files"])
    out["export"] = {"examples": n_exp, "export_ex_s": round(n_exp / t_exp),
                     "export_over_bare_time_per_example": round((t_exp / n_exp) / (t_bare / n_bare), 2)}
    _, t_rep = _timed(lambda: write_report(args.dataset, os.path.join(tmp, "report.html")))
    out["report"] = {"seconds": round(t_rep, 2), "report_over_one_read_pass": round(t_rep / t_bare, 2)}
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
