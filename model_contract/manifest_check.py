"""The checked parser of a manifest: every field of a (dataset or sidecar) manifest against its schema, before
`Manifest.from_dict` (model_contract/manifest.py) trusts it. Its paths and generation names steer reads and
deletions, its counts are checked and reported, so a bad one is a ContractError naming the field path.
"""
from __future__ import annotations

from model_contract.contract import ContractError
from model_contract.manifest_rows import (EXTRA_OBJECTS, SECTIONS, GenerationRow, InputFileStats, LedgerRow,
                                          RecordCounts, ShardInfo, SkippedInput)
from model_contract.schema import Fields, check_generation_name, check_relative_path

MANIFEST_FORMAT = "pileprep.manifest"
# commit_seq stays below 2^53: every JSON reader (a double in JavaScript, an int64 in Arrow, Parquet or Go) holds it
# exactly, and a forged 10^23 can neither outrank every real commit nor push the next one past int64
# (docs/wip/hostile-review-issue28.md F5).
COMMIT_SEQ_LIMIT = 2 ** 53


def check_contract_dict(d, prefix: str = "contract") -> None:
    """The contract's fields as the trainer sizes its model from them: types first (DataContract.from_dict
    converts with int(), so `seq_len: "512"` would pass it unnoticed)."""
    f = Fields(d, prefix)
    f.string("version")
    f.positive("seq_len")
    t = f.obj("tokenizer")
    t.string("kind")
    t.sha256("model_sha256")
    t.positive("vocab_size")
    for name in ("bos_id", "eos_id", "pad_id", "unk_id"):
        t.integer(name)
    for path, feature in f.items("features"):
        g = Fields(feature, path)
        g.string("name")
        g.string("dtype")
        for _path, dim in g.items("shape"):
            if dim is not None and not (isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0):
                g.fail("shape", "a list of sizes (integers >= 0, or null)", dim)
        g.string("description", required=False)
    if d.get("retrieval") is not None:
        r = f.obj("retrieval")
        for name in ("chunk_len", "num_neighbours", "neighbour_len"):
            r.positive(name)
        r.string("fingerprint", required=False)
        r.string("token_dtype", required=False)


def check_manifest_dict(d) -> None:
    """Every field of a (dataset or sidecar) manifest against its schema; ContractError naming the first bad
    field path, e.g. `manifest shards[3].sha256: expected a 64-hex string, got 12`."""
    f = Fields(d, "")
    if d.get("format") != MANIFEST_FORMAT:
        raise ContractError(f"not a pileprep manifest (format={d.get('format')!r})")
    f.string("pileprep_version", required=False)
    f.obj("contract")  # present and an object; then its fields
    check_contract_dict(d["contract"], "contract")
    for path, row in f.items("shards"):
        ShardInfo.from_dict(row, path)
    for split, totals in f.obj("splits", required=False).d.items():
        g = Fields(totals, f"splits.{split}")
        for k in totals:
            g.count(k)
    for source, per_split in f.obj("sources", required=False).d.items():
        g = Fields(per_split, f"sources.{source}")
        for split in per_split:
            g.counts(split)
    f.number("padding_fraction", required=False, lo=0, hi=1)
    RecordCounts.from_dict(d.get("records", {}), "records")
    for path, row in f.items("inputs", required=False):
        InputFileStats.from_dict(row, path)
    for path, rel in f.items("dead_letters", required=False):
        check_relative_path(rel, path)
    f.obj("config", required=False)
    if d.get("generation") is not None:
        check_generation_name(d["generation"], "generation")
    for path, row in f.items("generations", required=False):
        GenerationRow.from_dict(row, path)
    if d.get("ledger") is not None:
        for path, row in f.items("ledger"):
            LedgerRow.from_dict(row, path)
    for path, row in f.items("skipped_inputs", required=False):
        SkippedInput.from_dict(row, path)
    if "commit_seq" in d:  # absent: written before it was recorded; never null (no pileprep writes that)
        check_commit_seq(d["commit_seq"])
    if d.get("previous_generation") is not None:  # null: the output's first commit; absent: before the field
        check_generation_name(d["previous_generation"], "previous_generation")  # itself: refused by check_chain
    for key, _attr, read in SECTIONS:
        if key in d:
            read(d[key], key)
    for key in EXTRA_OBJECTS:
        if key in d:
            f.obj(key)


def check_commit_seq(value, where: str = "manifest commit_seq"):
    """`value` when it is a commit sequence number (an integer, 1 <= value < 2^53; not a bool, a float or a
    string), else a ContractError naming `where`. Pruning and `pileprep gc` order generations by it
    (pipeline/ops/generations.py): the live manifest and every generation manifest are held to this one rule."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < COMMIT_SEQ_LIMIT:
        shown = repr(value)
        raise ContractError(f"{where}: expected an integer >= 1 and < 2^53, got "
                            f"{shown if len(shown) <= 40 else shown[:37] + '...'}")
    return value
