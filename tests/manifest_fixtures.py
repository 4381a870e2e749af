"""Small hand-built manifests and stage results for the unit tests of the commit, the manifest and its merge."""
from __future__ import annotations

import json

from model_contract import DataContract, Manifest, ShardInfo, TokenizerInfo
from model_contract.manifest_rows import LedgerRow
from pipeline.config import ShardConfig
from transforms.shard import records


TOK = TokenizerInfo("sentencepiece", "ab" * 32, 1000, 2, 3, 0, 1)
GEN_A, GEN_B, GEN_C = ("gen-" + c * 16 for c in "abc")


def shard_config(**kw) -> ShardConfig:
    return ShardConfig(**{"inputs": ("in/*",), "output": "/out", "tokenizer": "t.model", "seq_len": 8, **kw})


def cut_result(path, read, dead=0):
    stats = records.FileStats(read=read)
    if dead:
        stats.dead_letter("invalid_json", dead)
    return records.CutResult(0, path, [], stats, None)


def shard_result(path, written, split=0):
    task = records.ShardTask(split, 0, 1)
    return records.ShardResult(task, f"/out/{GEN_A}/{task.file_name}", examples=1, tokens=5, padding_tokens=3,
                              documents=written, bytes=10, sha256="0" * 64,
                              sources={"s": {"documents": written, "tokens": 5}}, written_per_file={path: written})


def make_manifest(generation, shards=(), records=None, dead_letters=(), inputs=()):
    contract = DataContract.for_tokens(8, TOK)
    m = Manifest(contract=contract, shards=list(shards), records=records or {}, dead_letters=list(dead_letters),
                 inputs=list(inputs))
    m.generation = generation
    m.generations = [{"name": generation, "inputs": len(inputs), "shards": len(shards), "examples": 0,
                      "tokens": 0, "documents": 0}]
    m.ledger = []
    return m


def make_shard(gen, name="train-00000-of-00001.tfrecord", size=1):
    return ShardInfo(f"{gen}/{name}", "train", 1, 1, 0, 1, size, "0" * 64)


def valid_manifest_dict():
    m = make_manifest(GEN_A, [make_shard(GEN_A)], dead_letters=[f"{GEN_A}/dead_letter/f000000-read.jsonl"])
    m.ledger = [LedgerRow("in/a.jsonl", 3, GEN_A)]
    return json.loads(m.to_json())
