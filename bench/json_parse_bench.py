"""Per-document cost of parsing a record: the strict parser against orjson / msgspec and the proven fast path.

    PYTHONPATH=. python bench/json_parse_bench.py --inputs 'out/sample-corpus/train/*.jsonl.zst' [--repeats 5]

Reads every line of the inputs with the job's reader, then times, per document and on one thread, in
alternating rounds (medians, so a neighbour's load hits every parser alike):
- `json.loads` plain, and `loads_strict` (json.loads with the hooks that name every failure);
- `orjson.loads`, `msgspec.json.decode`, simdjson's parse + `as_dict` (each where installed; none of them
  refuses duplicate keys), and `loads_proven` (simdjson plus the checks that make its value the strict one,
  transforms/io/fast_json.py: orjson and msgspec drop a repeated key's first member while parsing, so
  proving the absence of duplicates there costs a second pass over the record: see docs/BENCHMARKS.md);
- `parse_record` as the job calls it, with the fast path and with the strict parser alone.
Before timing it checks that both parse_record paths give the same outcome on every line read. Ratios are to
strict `parse_record`, within one run: absolute figures on a shared machine are noisy, ratios less so.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from transforms.io import fast_json  # noqa: E402
from transforms.io.read_records import RawRecord, compression_of, iter_raw_records  # noqa: E402
from transforms.shard import documents  # noqa: E402


def read_lines(patterns: list) -> list:
    lines = []
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            with open(path, "rb") as f:
                lines += [i.data for i in iter_raw_records(f, compression_of(path)) if isinstance(i, RawRecord)]
    return lines


def strict_parse_record(line: bytes):
    saved, fast_json.simdjson = fast_json.simdjson, None
    try:
        return documents.parse_record(line)
    finally:
        fast_json.simdjson = saved


def candidates() -> dict:
    out = {"json.loads": json.loads, "loads_strict": documents.loads_strict}
    try:
        import orjson  # noqa: PLC0415
        out["orjson.loads"] = orjson.loads
    except ImportError:
        pass
    try:
        import msgspec  # noqa: PLC0415
        out["msgspec.json.decode"] = msgspec.json.Decoder().decode
    except ImportError:
        pass
    if fast_json.simdjson is not None:
        parser = fast_json.simdjson.Parser()
        out["simdjson parse + as_dict"] = lambda line: parser.parse(line).as_dict()
        out["loads_proven (simdjson, checked)"] = fast_json.loads_proven
    out["parse_record, strict"] = None  # filled below: the strict path switched around the whole loop
    out["parse_record, fast path"] = documents.parse_record
    return out


def time_once(name: str, fn, lines: list) -> float:
    if fn is None:
        saved, fast_json.simdjson = fast_json.simdjson, None
        try:
            return time_once(name, documents.parse_record, lines)
        finally:
            fast_json.simdjson = saved
    start = time.perf_counter()
    for line in lines:
        fn(line)
    return time.perf_counter() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", nargs="+", default=["out/sample-corpus/train/*.jsonl.zst"])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    lines = read_lines(args.inputs)
    if not lines:
        print("no records read from", args.inputs, file=sys.stderr)
        return 2
    differ = sum(documents.parse_record(line) != strict_parse_record(line) for line in lines)
    proven = sum(fast_json.loads_proven(line) is not fast_json.UNPROVEN for line in lines)
    mb = sum(map(len, lines)) / 1e6
    print(f"{len(lines)} records, {mb:.1f} MB; outcomes that differ fast vs strict: {differ}; "
          f"fast path proven for {proven} ({100 * proven / len(lines):.1f}%)")
    runs: dict = {name: [] for name in candidates()}
    for _ in range(args.repeats):  # alternating rounds: every parser sees the same moments of load
        for name, fn in candidates().items():
            runs[name].append(time_once(name, fn, lines))
    base = statistics.median(runs["parse_record, strict"])
    print(f"{'parser':34} {'us/doc':>8} {'MB/s':>8} {'vs strict parse_record':>24}")
    for name, times in runs.items():
        t = statistics.median(times)
        print(f"{name:34} {1e6 * t / len(lines):8.1f} {mb / t:8.0f} {t / base:23.2f}x")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
