"""CPU-seconds of the pack stage alone (transforms/shard/pack.py `pack_shard`), measured in process.

    python bench/pack_bench.py capture CORPUS OUT [--tokenizer MODEL]   # one `pileprep shard`, in-memory runner
    python bench/pack_bench.py replay OUT [--repeats 3] [--profile FILE]
    python bench/pack_bench.py frame SO [SO ...]   # built _varint modules against each other, on the same blocks

`capture` runs the bench's `pileprep shard` command line (bench/shard_bench.py `shard_args`, Beam's FnApiRunner
in memory, one worker, so every stage runs in this process) with `pack.pack_shard` wrapped: each call's
arguments are pickled to OUT/pack-capture/NNNN.pkl and the job's CPU-s (time.process_time around the whole
job) and the CPU-s spent inside pack_shard are printed. `replay` calls pack_shard again on every captured
shard, writing into a scratch directory, `--repeats` times, and prints each pass's CPU-s (process_time: the
figure a busy shared machine spoils least) and the minimum, with the sha256 of every file written (the shards
and id files must not change with an optimisation). `frame` times `frame_int64_examples` of each given build of
model_contract/_varint (a .so file) on the same blocks of synthetic Zipf-skewed ids (8.8 M tokens), each block
framed 7 times in a row (hot in cache, as after `_build_block`), best of 7 summed, and checks the bytes agree.
"""
from __future__ import annotations

import argparse
import cProfile
import glob
import hashlib
import os
import pickle
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))

from transforms.shard import pack  # noqa: E402

BEAM_ARGS = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


def capture(corpus: str, out: str, tokenizer: str, seq_len: int, profile_path: str | None = None) -> None:
    import shard_bench as sb  # noqa: PLC0415
    from pipeline import cli  # noqa: PLC0415

    cap = os.path.join(out, "pack-capture")
    shutil.rmtree(cap, ignore_errors=True)
    os.makedirs(cap)
    job_out = os.path.join(out, "job")
    shutil.rmtree(job_out, ignore_errors=True)
    shutil.rmtree(os.path.join(out, "kept-staging"), ignore_errors=True)
    real = pack.pack_shard
    spent = [0.0, 0]
    profile = cProfile.Profile() if profile_path else None  # the pack_shard calls only

    def wrapped(*args, **kwargs):
        if spent[1] == 0:  # every unit is staged by now: keep a copy, the job removes its staging when it commits
            shutil.copytree(args[7], os.path.join(out, "kept-staging"))
        with open(os.path.join(cap, f"{spent[1]:04d}.pkl"), "wb") as f:
            pickle.dump((args, kwargs), f, protocol=pickle.HIGHEST_PROTOCOL)
        spent[1] += 1
        t = time.process_time()
        if profile is not None:
            profile.enable()
        try:
            return real(*args, **kwargs)
        finally:
            if profile is not None:
                profile.disable()
            spent[0] += time.process_time() - t

    pack.pack_shard = wrapped
    argv = sb.shard_args(corpus, tokenizer, job_out, "auto", seq_len, BEAM_ARGS)[3:]
    t = time.process_time()
    rc = cli.main(argv)
    job = time.process_time() - t
    if profile is not None:
        profile.dump_stats(profile_path)
    print(f"rc {rc}  job CPU-s {job:.2f}  pack_shard CPU-s {spent[0]:.2f} in {spent[1]} calls")


def replay(out: str, repeats: int, profile: str | None) -> None:
    calls = []
    for path in sorted(glob.glob(os.path.join(out, "pack-capture", "*.pkl"))):
        with open(path, "rb") as f:
            calls.append(pickle.load(f))
    staged = calls[0][0][7]  # the units' spill files and dedup ids, where the captured arguments name them
    if not os.path.isdir(staged):
        shutil.copytree(os.path.join(out, "kept-staging"), staged)
    times = []
    for r in range(repeats + (1 if profile else 0)):  # the profiled pass comes last, outside the minimum
        scratch = tempfile.mkdtemp(prefix="pack-bench-", dir=out)
        data_dir, staging = os.path.join(scratch, "data"), os.path.join(scratch, "staging")
        os.makedirs(data_dir)
        os.makedirs(os.path.join(staging, "ids"))
        prof = cProfile.Profile() if profile and r == repeats else None
        t = time.process_time()
        if prof:
            prof.enable()
        for args, kwargs in calls:
            args = list(args)
            args[5] = data_dir  # data_dir
            if len(args) > 7:
                args[7] = staging
            else:
                kwargs["staging_dir"] = staging
            pack.pack_shard(*args, **kwargs)
        if prof:
            prof.disable()
            prof.dump_stats(profile)
        times.append(time.process_time() - t)
        digest = hashlib.sha256()
        for path in sorted(glob.glob(os.path.join(scratch, "**", "*"), recursive=True)):
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    digest.update(os.path.relpath(path, scratch).encode() + b"\0" + hashlib.sha256(f.read()).digest())
        shutil.rmtree(scratch)
        print(f"pass {r}: {times[-1]:.3f} CPU-s{' (profiled)' if prof else ''}  files sha256 {digest.hexdigest()[:16]}")
    best = min(times[:repeats])
    print(f"pack_shard on {len(calls)} shards: min {best:.3f} CPU-s")


def frame(builds: list) -> None:
    import importlib.util  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415

    from model_contract.example_codec import frame_entries  # noqa: PLC0415
    from transforms.shard.packing import pack_blocks  # noqa: PLC0415

    rng = np.random.default_rng(0)
    docs = []
    for _ in range(3000):
        n = int(rng.lognormal(7.5, 1.0)) + 1
        docs.append((int(rng.integers(0, 2 ** 63 - 1)), np.minimum(rng.zipf(1.2, n), 31999).astype(np.int64)))
    calls = [(frame_entries(b.columns()), b.examples) for b in pack_blocks(docs, 2048, 0)]
    outputs = []
    for path in builds:
        spec = importlib.util.spec_from_file_location("model_contract._varint", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        spent, out = 0.0, []
        for columns, n in calls:
            best = float("inf")
            for _ in range(7):
                t = time.perf_counter()
                data = module.frame_int64_examples(columns, n)
                best = min(best, time.perf_counter() - t)
            spent += best
            out.append(data)
        outputs.append(out)
        print(f"{path}: {spent * 1e3:.1f} ms for {sum(n for _, n in calls) * 2048} tokens"
              f"{'' if out == outputs[0] else '  BYTES DIFFER from the first build'}")


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("corpus")
    c.add_argument("out")
    c.add_argument("--tokenizer", default=os.path.join(os.path.dirname(REPO), "shared", "data", "tokenizers",
                                                       "llama2-bpe-32k.model"))
    c.add_argument("--seq-len", type=int, default=2048)
    c.add_argument("--profile", default=None, help="cProfile of the pack_shard calls alone, to this file")
    r = sub.add_parser("replay")
    r.add_argument("out")
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--profile", default=None)
    f = sub.add_parser("frame")
    f.add_argument("builds", nargs="+")
    a = p.parse_args()
    if a.cmd == "frame":
        frame(a.builds)
    elif a.cmd == "capture":
        capture(a.corpus, a.out, a.tokenizer, a.seq_len, a.profile)
    else:
        replay(a.out, a.repeats, a.profile)


if __name__ == "__main__":
    main()
