"""RETRO vs plain GPT loss on a small corpus: shards -> BM25 chunk database -> neighbours
sidecar, then the bundled trainer twice on the same data order and seed, with and without --retro-sidecar.

    PYTHONPATH=. python bench/retro_loss.py --work /tmp/retro-bench --steps 60

Prints each run's first and last logged losses (and the mean of the last 10). On a tiny model and corpus the
difference can be noise; the numbers are reported as measured.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]


def tokenizer(path: pathlib.Path) -> str:
    import sentencepiece as spm

    from tests.conftest import stdlib_texts
    if not path.exists():
        model = io.BytesIO()
        sentences = [line for _, text in stdlib_texts(3_000_000) for line in text.splitlines() if line.strip()]
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences[:60_000]), model_writer=model, vocab_size=1000, model_type="bpe",
            byte_fallback=True, pad_id=0, unk_id=1, bos_id=2, eos_id=3, normalization_rule_name="identity",
            remove_extra_whitespaces=False, num_threads=1, minloglevel=2)
        path.write_bytes(model.getvalue())
    return str(path)


def build_data(work: pathlib.Path, corpus_bytes: int, seq_len: int, chunk: int) -> tuple:
    from pipeline.config import ShardConfig
    from pipeline.retrieval import build, neighbours
    from pipeline.retrieval.config import BuildConfig, NeighboursConfig
    from pipeline.shard import shard_pipeline
    from tests.corpus_fixtures import write_good_corpus
    ds, db, nb = work / "ds", work / "db", work / "nb"
    if not (nb / "manifest.json").exists():
        write_good_corpus(work / "corpus", limit_bytes=corpus_bytes, files=2)
        shard_pipeline.run(ShardConfig(inputs=(str(work / "corpus" / "*"),), output=str(ds),
                                       tokenizer=tokenizer(work / "tok.model"), seq_len=seq_len, num_shards=2,
                                       val_fraction=0.0, test_fraction=0.0, unit_mb=0.05), IN_MEMORY)
        build.run(BuildConfig(dataset=str(ds), output=str(db), chunk_len=chunk, num_db_shards=2), IN_MEMORY)
        neighbours.run(NeighboursConfig(dataset=str(ds), db=str(db), output=str(nb), neighbour_len=2 * chunk),
                       IN_MEMORY)
    return str(ds), str(nb)


def train(ds: str, extra: list, metrics: pathlib.Path, steps: int) -> list:
    if metrics.exists():
        metrics.unlink()
    cmd = [sys.executable, "-m", "trainer.train", "--data", ds, "--n-layers", "4", "--d-model", "64",
           "--n-heads", "4", "--global-batch", "8", "--steps", str(steps), "--log-every", "1", "--lr", "3e-3",
           "--warmup-steps", "5", "--threads", "2", "--metrics-file", str(metrics), *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_WAIT_POLICY="PASSIVE")
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, text=True)
    return [json.loads(line)["loss"] for line in open(metrics) if line.strip()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="/tmp/retro-bench")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--corpus-bytes", type=int, default=200_000)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--chunk", type=int, default=32)
    p.add_argument("--retro-layers", default="1,3")
    a = p.parse_args()
    work = pathlib.Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    ds, nb = build_data(work, a.corpus_bytes, a.seq_len, a.chunk)
    from model_contract import load_manifest
    examples = sum(s.examples for s in load_manifest(ds).shards_for("train"))
    runs = {"plain": train(ds, [], work / "plain.jsonl", a.steps),
            "retro": train(ds, ["--retro-sidecar", nb, "--retro-layers", a.retro_layers], work / "retro.jsonl",
                           a.steps)}
    print(f"{examples} train examples of {a.seq_len} tokens, chunk {a.chunk}, {a.steps} steps x 8 sequences")
    for name, ls in runs.items():
        tail = ls[-10:]
        print(f"{name:6s} first {ls[0]:.4f}  last {ls[-1]:.4f}  mean(last 10) {sum(tail) / len(tail):.4f}")


if __name__ == "__main__":
    main()
