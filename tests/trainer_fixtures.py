"""Small, learnable pileprep-format datasets for the trainer tests (manifest + CRC-framed TFRecord shards)."""
from __future__ import annotations

import hashlib
import json
import os

import numpy as np

from model_contract import DataContract, Manifest, ShardInfo, TokenizerInfo, encode_example, frame_record
from transforms.shard.packing import pack_blocks

EOS = 1
PAD = 0


def make_documents(n_docs: int, vocab: int, seed: int = 0, min_len: int = 5, max_len: int = 60):
    """Documents with a learnable pattern: each is an arithmetic progression mod (vocab-2), + EOS."""
    rng = np.random.default_rng(seed)
    for d in range(n_docs):
        n = int(rng.integers(min_len, max_len))
        start, step = int(rng.integers(0, vocab - 2)), int(rng.integers(1, 4))
        toks = (start + step * np.arange(n)) % (vocab - 2) + 2
        yield d, np.concatenate([toks, [EOS]]).astype(np.int64)


def write_dataset(out_dir: str, *, seq_len: int = 32, vocab: int = 64, n_docs: int = 400, n_shards: int = 3,
                  seed: int = 0, generation: str = "gen-test", min_len: int = 5, max_len: int = 60) -> str:
    """Write <out_dir>/manifest.json + <out_dir>/<generation>/train-0000i-of-0000n.tfrecord; return out_dir."""
    os.makedirs(os.path.join(out_dir, generation), exist_ok=True)
    docs = list(make_documents(n_docs, vocab, seed, min_len, max_len))
    shard_docs = [docs[i::n_shards] for i in range(n_shards)]
    shards = []
    for i, group in enumerate(shard_docs):
        rel = f"{generation}/train-{i:05d}-of-{n_shards:05d}.tfrecord"
        examples = [b.example(e) for b in pack_blocks(group, seq_len, PAD) for e in range(b.examples)]
        data = b"".join(frame_record(encode_example(e.features())) for e in examples)
        with open(os.path.join(out_dir, rel), "wb") as f:
            f.write(data)
        shards.append(ShardInfo(path=rel, split="train", examples=len(examples),
                                tokens=sum(seq_len - e.padding for e in examples),
                                padding_tokens=sum(e.padding for e in examples), documents=len(group),
                                bytes=len(data), sha256=hashlib.sha256(data).hexdigest()))
    tok = TokenizerInfo(kind="sentencepiece", model_sha256="0" * 64, vocab_size=vocab, bos_id=2, eos_id=EOS,
                        pad_id=PAD, unk_id=3)
    manifest = Manifest(contract=DataContract.for_tokens(seq_len, tok), shards=shards,
                        splits={"train": {"examples": sum(s.examples for s in shards)}})
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        f.write(manifest.to_json())
    return out_dir


def loader_of(dataset: str, dp_rank: int = 0, dp: int = 1, seed: int = 0, streams: int = 4, gb: int = 8,
              buf: int = 16):
    """A ShardLoader over `dataset` (seq_len 32, vocab 64) for data-parallel rank `dp_rank` of `dp`: the loader
    the data-order, loader and shard tests share (tests/unit/trainer)."""
    from trainer.config import DataConfig, model_config  # noqa: PLC0415 - the dataset writers need no trainer
    from trainer.data import ShardLoader  # noqa: PLC0415
    from trainer.dataset import open_dataset  # noqa: PLC0415

    cfg = model_config("tiny", seq_len=32, vocab_size=64, n_layers=3, d_model=32, n_heads=2)
    manifest, mfile = open_dataset(DataConfig(path=dataset), cfg)
    return ShardLoader(manifest, mfile, DataConfig(path=dataset, seed=seed, streams=streams, shuffle_buffer=buf),
                       32, gb, dp_rank, dp)


def merge_states(states: list) -> dict:
    """Loader states of several ranks (identical by construction: trainer/streams.py) as one run-wide state, the
    ranks checked to agree first (the trainer saves one rank's: trainer/train.py)."""
    for st in states[1:]:
        if (st["epoch"], st["step_in_epoch"]) != (states[0]["epoch"], states[0]["step_in_epoch"]):
            raise RuntimeError("data-parallel ranks disagree on the loader position")
    return states[0]


def batch_ids(batch) -> list:
    """A batch's input ids as tuples, one per example (comparable across loaders)."""
    return [tuple(r) for r in batch["input_ids"].tolist()]


def edit_manifest(d: str, edit) -> None:
    """Rewrite <d>/manifest.json through `edit(manifest dict)`, the way a hand edit or damage would."""
    path = os.path.join(d, "manifest.json")
    m = json.loads(open(path).read())
    edit(m)
    open(path, "w").write(json.dumps(m))
