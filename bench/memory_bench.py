"""Peak memory of the real `pileprep shard` CLI on hostile inputs, against a normal run.

    python bench/memory_bench.py [--tokenizer MODEL] [--workers 2] [--cases ref,bomb,noline,limit,blanks]
                                 [--code-root DIR]   # another checkout's code, e.g. /work/main for "before"

Cases, each a fresh `pileprep shard` process tree at the default limits (FnApiRunner, N worker processes):
  ref     the good documents alone (a few MB of real text): the baseline the others are compared with
  bomb    a ~100 KB .jsonl.zst whose one line expands to 3 GiB (then one good line)
  noline  a 300 MB .jsonl of one line without a newline
  limit   one document exactly at the default --max-line-mb, of digits (one token per byte, ~57 bytes of
          SentencePiece memory per byte of text): a token-less run over --max-pretoken-mb, dead-lettered
Worst-case documents at the default --max-line-mb that are written (tokenized in exact pieces,
transforms/tokenize/long_documents.py), raw UTF-8 in the JSON line:
  astral  words of three astral characters (byte fallback: 4 tokens per character) and a space
  cjk     CJK characters with a space every 64 of them
  run     one token-less run of astral characters just under --max-pretoken-mb (encoded in one call), then
          astral words up to the limit
  digits  one run of digits just under --max-pretoken-mb, then digit words up to the limit
Each of these four is followed by one short document, which lets `auto` pass its parity sample and pick the fast
backend (gigatoken for Llama 2); `--backend sentencepiece` measures the reference.
  blanks  4 Mi blank lines (then one good line)
Two figures per case: the peak of the *sum* of RSS over the whole process tree (sampled every 50 ms with
psutil) and the largest single process's ru_maxrss (RUSAGE_SELF / RUSAGE_CHILDREN inside the CLI process).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import psutil
import zstandard

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_TOKENIZER = os.path.join(os.path.dirname(REPO), "shared", "data", "tokenizers", "llama2-bpe-32k.model")
MiB = 1 << 20
_CODE = ("import json, resource, sys\n"
         "from pipeline.cli import main\n"
         "rc = main(sys.argv[1:])\n"
         "r = resource\n"
         "print('BENCH', json.dumps({'self_kb': r.getrusage(r.RUSAGE_SELF).ru_maxrss, "
         "'children_kb': r.getrusage(r.RUSAGE_CHILDREN).ru_maxrss}))\n"
         "sys.exit(rc)\n")


def good_lines(limit_bytes: int = 4 * MiB) -> bytes:
    """Real text (the standard library's sources) as Pile-format lines."""
    import sysconfig

    out, total = [], 0
    for name in sorted(os.listdir(sysconfig.get_paths()["stdlib"])):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(sysconfig.get_paths()["stdlib"], name), encoding="utf-8", errors="replace") as f:
            text = f.read()
        line = json.dumps({"text": text, "meta": {"pile_set_name": "StdlibCode"}}).encode() + b"\n"
        out.append(line)
        total += len(line)
        if total >= limit_bytes:
            break
    return b"".join(out)


def write_case(case: str, root: str, max_line_bytes: int) -> None:
    os.makedirs(root)
    after = json.dumps({"text": "a good line after it", "meta": {"pile_set_name": "S"}}).encode() + b"\n"
    if case == "ref":
        with open(os.path.join(root, "good.jsonl"), "wb") as f:
            f.write(good_lines())
    elif case == "bomb":
        with open(os.path.join(root, "bomb.jsonl.zst"), "wb") as f:
            with zstandard.ZstdCompressor(level=3).stream_writer(f, closefd=False) as w:
                piece = b"x" * (64 * MiB)
                for _ in range(3 * 1024 // 64):
                    w.write(piece)
                w.write(b"\n" + after)
    elif case == "noline":
        with open(os.path.join(root, "noline.jsonl"), "wb") as f:
            piece = b"y" * (10 * 1000 * 1000)
            for _ in range(30):
                f.write(piece)
    elif case == "limit":
        head, tail = b'{"text": "', b'", "meta": {"pile_set_name": "S"}}'
        n = max_line_bytes - len(head) - len(tail)
        digits = (b"0123456789" * (n // 10 + 1))[:n]
        with open(os.path.join(root, "limit.jsonl"), "wb") as f:
            f.write(head + digits + tail + b"\n")
    elif case in ("astral", "cjk", "run", "digits"):
        from pipeline.config import ShardConfig  # noqa: PLC0415 - the checkout's own default

        head, tail = b'{"text": "', b'", "meta": {"pile_set_name": "S"}}'
        n = max_line_bytes - len(head) - len(tail)
        astral_word = "\U0001F600\U0001F680\U0001F9E0 ".encode()
        word = {"astral": astral_word, "run": astral_word, "digits": b"0123456789 ",
                "cjk": ("\u4e2d\u6587\u6587\u672c" * 16 + " ").encode()}[case]
        run = b""
        if case in ("run", "digits"):
            run_bytes = int(ShardConfig.max_pretoken_mb * MiB) - 64
            unit = "\U0001F600".encode() if case == "run" else b"0123456789"
            run = (unit * (run_bytes // len(unit)))
        body = run + b" " + word * ((n - len(run) - 1) // len(word))
        with open(os.path.join(root, case + ".jsonl"), "wb") as f:  # + a short document: the parity sample
            f.write(head + body + tail + b"\n" + after)  # (texts over 1 MiB are not in it), so auto can pick
    elif case == "blanks":
        with open(os.path.join(root, "blanks.jsonl"), "wb") as f:
            f.write(b"\n" * (4 << 20) + after)
    else:
        raise SystemExit(f"unknown case {case}")


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_case(case: str, tmp: str, tokenizer: str, workers: int, code_root: str, max_line_bytes: int,
             backend: str = "") -> dict:
    inputs = os.path.join(tmp, case)
    write_case(case, inputs, max_line_bytes)
    out = os.path.join(tmp, case + "-out")
    args = [sys.executable, "-c", _CODE, "shard", "--input", os.path.join(inputs, "*"), "--output", out,
            "--tokenizer", tokenizer, "--num-shards", "1", "--val-fraction", "0", "--test-fraction", "0",
            *(["--tokenizer-backend", backend] if backend else []),
            "--runner=FnApiRunner", f"--direct_num_workers={workers}",
            "--direct_running_mode=" + ("multi_processing" if workers > 1 else "in_memory")]
    env = dict(os.environ, PYTHONPATH=code_root, OMP_WAIT_POLICY="PASSIVE")
    start = time.perf_counter()
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             cwd=code_root)  # `python -c` puts the working directory first on sys.path
    peak = [0]
    done = threading.Event()

    def sample():
        ps = psutil.Process(child.pid)
        while not done.is_set():
            try:
                peak[0] = max(peak[0], tree_rss(ps))
            except psutil.Error:
                break
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = child.communicate()
    done.set()
    sampler.join()
    result = {"case": case, "exit": child.returncode, "wall_s": round(time.perf_counter() - start, 1),
              "tree_peak_mb": round(peak[0] / MiB)}
    if "BENCH" in stdout:
        kb = json.loads(stdout.split("BENCH", 1)[1].strip().splitlines()[0])
        result["largest_process_mb"] = round(max(kb["self_kb"], kb["children_kb"]) / 1024)
    manifest_path = os.path.join(out, "manifest.json")
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            m = json.load(f)
        result["records"] = {k: m["records"][k] for k in ("read", "written", "filtered", "dead_lettered")}
        result["backend"] = m.get("tokenizer_backend", {}).get("name", "")
    else:
        result["error"] = stderr.strip().splitlines()[-1][:300] if stderr.strip() else ""
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", default=SHARED_TOKENIZER)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cases", default="ref,bomb,noline,limit,blanks")
    p.add_argument("--code-root", default=REPO, help="checkout whose pileprep runs (default: this one)")
    p.add_argument("--backend", default="", help="--tokenizer-backend of the runs (default: the CLI's, auto)")
    p.add_argument("--max-line-mb", type=float, default=None,
                   help="size of the 'limit' document (default: this checkout's --max-line-mb default)")
    args = p.parse_args(argv)
    if not os.path.exists(args.tokenizer):
        raise SystemExit(f"tokenizer {args.tokenizer} not found; pass --tokenizer")
    sys.path.insert(0, REPO)
    from pipeline.config import ShardConfig  # noqa: PLC0415

    max_line_mb = args.max_line_mb or ShardConfig.max_line_mb
    rows = []
    with tempfile.TemporaryDirectory(prefix="memory-bench-") as tmp:
        for case in args.cases.split(","):
            row = run_case(case, tmp, args.tokenizer, args.workers, args.code_root, int(max_line_mb * MiB),
                           args.backend)
            rows.append(row)
            print(json.dumps(row), flush=True)
    ref = next((r for r in rows if r["case"] == "ref"), None)
    if ref:
        for r in rows:
            r["tree_vs_ref"] = round(r["tree_peak_mb"] / max(1, ref["tree_peak_mb"]), 2)
    print(f"{'case':8} {'exit':>4} {'wall s':>7} {'tree peak MB':>12} {'x ref':>6} {'largest proc MB':>15}")
    for r in rows:
        print(f"{r['case']:8} {r['exit']:>4} {r['wall_s']:>7} {r['tree_peak_mb']:>12} {r.get('tree_vs_ref', ''):>6} "
              f"{r.get('largest_process_mb', ''):>15}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
