"""Hugging Face `datasets` from a committed dataset: Parquet files under `data/` and a dataset card (README.md)
whose `configs` and `dataset_info` `datasets.load_dataset(DIR)` reads (splits, features, example counts).

One Parquet file per shard, `data/<split>-NNNNN-of-NNNNN.parquet` (the name pattern `datasets` maps to a split),
one row per packed example in shard order, the columns and row groups of pipeline/tools/export.py's Parquet
export (the same writer: input_ids, segment_ids, positions as list<int32>; piece_doc_ids, piece_offsets as
list<int64>; split, shard, record). Tests open it with `datasets.load_dataset` and compare token for token.
"""
from __future__ import annotations

from model_contract import resolve_shard_path
from pipeline.tools.export import ROWS_PER_GROUP, _export_shard, parquet_schema
from transforms.io import io_utils

VERSION = 1
CARD = "README.md"


def write_split(job) -> list:
    rows = []
    count = len(job.shards)
    for i, shard in enumerate(job.shards):
        name = f"data/{job.split}-{i:05d}-of-{count:05d}.parquet"
        examples: list = []

        def fill(tmp: str, shard=shard, examples=examples) -> None:
            with io_utils.open_read(resolve_shard_path(job.manifest_file, shard)) as src, open(tmp, "wb") as dst:
                examples.append(_export_shard(src, dst, shard, ROWS_PER_GROUP))

        row = job.put(name, fill)
        row.update(rows_written=examples[0], source_shard=shard.path)
        rows.append(row)
    return rows


def _yaml_type(arrow_type) -> str:
    import pyarrow as pa  # noqa: PLC0415

    if pa.types.is_list(arrow_type):
        return f"list: {arrow_type.value_type}"
    return f"dtype: {'string' if pa.types.is_string(arrow_type) else arrow_type}"


def card(manifest, splits: list, files: list) -> str:
    """The dataset card: YAML front matter with `configs` (each split's files) and `dataset_info`."""
    lines = ["---", "configs:", "- config_name: default", "  data_files:"]
    for split in splits:
        lines += [f"  - split: {split}", f"    path: data/{split}-*"]
    lines += ["dataset_info:", "  features:"]
    for f in parquet_schema():
        lines += [f"  - name: {f.name}", f"    {_yaml_type(f.type)}"]
    lines += ["  splits:"]
    for split in splits:
        examples = sum(r.get("rows_written", 0) for r in files if r.get("split") == split)
        size = sum(r["bytes"] for r in files if r.get("split") == split)
        lines += [f"  - name: {split}", f"    num_bytes: {size}", f"    num_examples: {examples}"]
    lines += ["---", "", f"Packed examples of {manifest.contract.seq_len} tokens exported by `pileprep export "
              f"--format hf` from generation `{manifest.generation}`; segment_ids 0 marks padding.", ""]
    return "\n".join(lines)


def finish(job, splits: list, files: list) -> list:
    text = card(job.manifest, splits, files)

    def fill(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    return [job.put(CARD, fill)]
