"""The pack stage: one (split, shard) -> one TFRecord shard, packed from its key range of every unit.
"""
from __future__ import annotations

import collections
from typing import Optional

import numpy as np

from model_contract import frame_examples
from transforms.io import io_utils
from transforms.shard import corpus_stats, doc_ids, layout, mixture, packing_stats
from transforms.shard.near_dedup import removals
from transforms.shard.best_fit import DEFAULT_WINDOW_EXAMPLES, pack_best_fit
from transforms.shard.documents import shard_key_range
from transforms.shard.exact_dedup import duplicate_mask
from transforms.shard.layout import Layout
from transforms.shard.packing import pack_blocks
from transforms.shard.records import DedupInputs, ShardResult, ShardTask, UnitResult
from transforms.shard.spill import INDEX_DTYPE, read_index_range, read_token_range


def _gather_shard_documents(task: ShardTask, units: list[UnitResult]):
    """Index rows of every unit in this shard's key range, merged in key order, plus their token buffers."""
    lo, hi = shard_key_range(task.split, task.shard, task.num_shards)
    parts, buffers = [], []
    for u, unit in enumerate(units):
        if unit.n_docs == 0:
            continue
        with io_utils.open_read(unit.index_path) as f:
            rows = read_index_range(f, unit.n_docs, lo, hi)
        if rows.size == 0:
            continue
        start = int(rows["token_start"][0])
        count = int(rows["token_start"][-1] + rows["n_tokens"][-1]) - start
        with io_utils.open_read(unit.tokens_path) as f:
            buffers.append((u, start, read_token_range(f, np.dtype(unit.token_dtype), start, count)))
        parts.append(rows)
    return merge_shard_parts(parts, buffers)


def merge_shard_parts(parts: list, buffers: list):
    """(rows, which, buffers): the parts' index rows merged in key order, `which` naming each row's buffer.

    parts[i] are one unit's rows in the shard's key range and buffers[i] = (unit position, token_start of its
    first row, its tokens). The order is total (file and line tell any two records apart), so it does not depend
    on the order the parts came in: the file spill and the runner's shuffle (transforms/shard/shard_shuffle.py) merge
    to the same rows."""
    if not parts:
        return np.zeros(0, dtype=INDEX_DTYPE), np.zeros(0, dtype=np.int64), buffers
    rows = np.concatenate(parts)
    which = np.concatenate([np.full(p.size, b, dtype=np.int64) for b, p in enumerate(parts)])
    order = np.lexsort((rows["line"], rows["file_idx"], rows["doc_id"], rows["key"]))
    return rows[order], which[order], buffers


def append_eos(body: np.ndarray, eos_id: int, cache: dict) -> np.ndarray:
    """A document's tokens with EOS appended, kept in the spill's dtype (uint16 for a 32k vocabulary): the packer
    casts every token to int64 once, as it copies it into its block, instead of a cast here and a copy there.
    Where the id does not fit that dtype, the result is int64. `cache` keeps the EOS array per dtype."""
    eos = cache.get(body.dtype)
    if eos is None:
        info = np.iinfo(body.dtype)
        eos = cache[body.dtype] = np.array([eos_id], dtype=body.dtype if info.min <= eos_id <= info.max else np.int64)
    return np.concatenate((body, eos))


def pack_shard(task: ShardTask, units: list, seq_len: int, eos_id: int, pad_id: int, data_dir: str,
               dedup: Optional[DedupInputs] = None, staging_dir: Optional[str] = None,
               mixture_weights: Optional[dict] = None, seed: int = 0,
               gathered: Optional[tuple] = None, packing: str = "concat",
               packing_window: int = DEFAULT_WINDOW_EXAMPLES) -> ShardResult:
    """Write one shard: its documents from every unit, deduplicated, weighted (train, transforms/shard/mixture.py),
    packed, framed, checksummed.

    Exact duplicates (one document id) are dropped first: a copy whose id a winning split or a committed
    generation holds (`dedup`), and every copy after the first inside the shard. With `staging_dir`, the ids
    kept by dedup (before mixture weights) go to a sorted id file there, merged later into the generation's id
    index, so a later duplicate of a document a weight dropped is still a duplicate, as in a full build.

    `gathered`: the shard's (rows, which, buffers), already merged by `merge_shard_parts` from the pieces the
    runner's shuffle delivered (transforms/shard/shard_shuffle.py); `units` then holds those pieces. Without it the
    packer gathers its key range from every unit's spill files.

    `packing`: "concat" (transforms/shard/packing.py) or "best-fit" (transforms/shard/best_fit.py, a window of
    `packing_window` examples' worth of tokens)."""
    rows, which, buffers = gathered if gathered is not None else _gather_shard_documents(task, units)
    elsewhere = duplicate_mask(rows, task.split, dedup)
    removed = removals.reasons_for(rows["doc_id"], task.split, staging_dir)  # after exact dedup
    filtered: dict = collections.defaultdict(collections.Counter)
    filtered_sources: dict = collections.defaultdict(collections.Counter)
    result = ShardResult(task, Layout("", data_dir).path(layout.shard_file(task.file_name)), 0, 0, 0, 0, 0, "")
    sources: dict = collections.defaultdict(lambda: {"documents": 0, "tokens": 0})
    written: dict = collections.Counter()
    duplicates: dict = collections.Counter()
    duplicate_sources: dict = collections.Counter()
    kept_ids: list = []
    dropped: dict = collections.Counter()
    stats: dict = {}
    eos_of: dict = {}  # token dtype -> EOS as a 1-array of it
    packed: dict = {}  # source -> packing counters
    position = 0  # the concat packer's stream position: which examples a document spans follows from it

    def with_eos(body: np.ndarray) -> np.ndarray:
        return append_eos(body, eos_id, eos_of)

    def unique_documents():
        previous_doc = None
        # The index columns as Python ints, converted once per shard: a structured row's field and int() per
        # document cost more than the rest of this loop.
        columns = zip(rows["key"].tolist(), rows["doc_id"].tolist(), rows["source_idx"].tolist(),
                      rows["token_start"].tolist(), rows["n_tokens"].tolist(), which.tolist(), elsewhere.tolist())
        for i, (key, doc_id, source_idx, token_start, n_tokens, b, copy_elsewhere) in enumerate(columns):
            u, start, buf = buffers[b]
            unit = units[u]
            source_name = unit.sources[source_idx]
            if doc_id == previous_doc or copy_elsewhere:  # exact duplicate (same text): the kept copy is elsewhere
                duplicates[unit.input_path] += 1
                duplicate_sources[source_name] += 1
                corpus_stats.add_duplicate(stats, source_name)
                continue
            previous_doc = doc_id
            kept_ids.append(doc_id)
            if removed is not None and removed[i]:  # a near-copy or contaminated: its reason and keeper are staged
                filtered[unit.input_path][removed[i]] += 1
                filtered_sources[removed[i]][source_name] += 1
                continue
            a = token_start - start
            corpus_stats.add_unique(stats, source_name, n_tokens + 1)
            yield key, doc_id, source_name, (unit.input_path, buf[a:a + n_tokens])

    def on_dropped(_source_name, payload):
        dropped[payload[0]] += 1

    if mixture_weights and task.split == 0:
        lo, hi = shard_key_range(task.split, task.shard, task.num_shards)
        copies = mixture.arrange(unique_documents(), mixture_weights, seed, lo, hi, on_dropped)
    else:
        copies = ((doc_id, source_name, payload, 0) for _key, doc_id, source_name, payload in unique_documents())

    def documents():
        nonlocal position
        for doc_id, source_name, (input_path, body), repeat in copies:
            tokens = with_eos(body)
            packing_stats.add(packed, source_name, tokens.size,
                              packing_stats.pieces_of(packing, position, tokens.size, seq_len), seq_len)
            position += tokens.size
            source = sources[source_name]
            source["documents"] += 1
            source["tokens"] += tokens.size
            corpus_stats.add_written(stats, source_name, body.size)
            if repeat == 0:
                written[input_path] += 1
            result.documents += 1
            yield doc_id, tokens

    with io_utils.open_write(result.path) as raw, io_utils.HashingWriter(raw) as out:
        blocks = (pack_best_fit(documents(), seq_len, pad_id, packing_window) if packing == "best-fit"
                  else pack_blocks(documents(), seq_len, pad_id))
        for block in blocks:  # a block of examples: one encode call, no GIL
            out.write(frame_examples(block.columns(), block.examples))
            result.examples += block.examples
            result.tokens += block.examples * seq_len - block.padding
            result.padding_tokens += block.padding
    result.bytes, result.sha256 = out.bytes, out.sha256
    result.sources = {k: dict(v) for k, v in sorted(sources.items())}
    result.written_per_file = dict(sorted(written.items()))
    result.duplicates_per_file = dict(sorted(duplicates.items()))
    result.duplicates_per_source = dict(sorted(duplicate_sources.items()))
    result.dropped_per_file = dict(sorted(dropped.items()))
    result.source_stats = stats
    result.packing = {k: v for k, v in sorted(packed.items())}
    result.filtered_per_file = {p: dict(sorted(c.items())) for p, c in sorted(filtered.items())}
    result.filtered_per_source = {r: dict(sorted(c.items())) for r, c in sorted(filtered_sources.items())}
    if staging_dir is not None:
        result.ids_path = Layout(staging_dir, "").path(layout.shard_ids(task.file_name))
        result.ids_count = len(kept_ids)
        with io_utils.open_write(result.ids_path) as f:
            doc_ids.write_sorted_ids(f, np.array(kept_ids, dtype=doc_ids.ID_DTYPE))
    return result

