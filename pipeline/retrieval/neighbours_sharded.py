"""`retrieval neighbours --ranges R`: the sidecar (plan: a neighbours.NeighboursPlan) from the IVF index searched in R ranges of inverted lists
through the runner's own GroupByKey (pipeline/retrieval/sharded.py), so no worker holds the whole index.

    dataset shards --QueryVectors--> (key, vector, exclusion), key = (shard, record, chunk)
        --sharded.search_queries (Route, GroupByKey by range, SearchRange, CoGroupByKey by key, MergeQuery)-->
        (key, k rows) --CoGroupByKey by shard with the shard list--> WriteShard (the same file as
        sidecar_files.neighbour_shard writes) --> ToList --> commit

The range files are cut from the database's trained index and parts before the graph runs, one range at a time
(each range = the trained index + every part's lists of that range: one part and one range in memory), into
this run's staging directory, which the commit deletes. The trained index, which holds no vectors, is the router.
Re-ranking reads the database's embedding files by row (retrieval_rerank.FileRowsSet), never whole; the query
workers' exclusions and the sidecar writers' tokens come from the chunk database read by row group
(pipeline/retrieval/db_rows.py), never whole either: a worker's memory is one range or row group plus one
dataset shard's queries.

What decides a query's rows: its vector (encoded per dataset shard in fixed batches, one torch thread, so the
same on every runner), the ranges' candidates under the same exclusion, and retrieval_ranges' rules (score desc,
then database row). None of it depends on R, the worker count or the runner (tests/e2e/test_retrieval_sharded.py).
"""
from __future__ import annotations

import os

import apache_beam as beam
import numpy as np

from pipeline.beam_glue import PlanDoFn
from pipeline.errors import ConfigError
from pipeline.retrieval import db_rows, sharded, store
from pipeline.retrieval.sidecar_files import commit_sidecar, neighbour_shard, shard_query_chunks
from transforms.io import io_utils
from transforms.retrieval import retrieval_encoders, retrieval_index, retrieval_ranges
from transforms.tokenize import tokenizer


def index_dir(plan) -> str:
    return io_utils.join(plan.staging_dir, f"ranges-{plan.config.ranges}")


def _db_file(plan, rel: str) -> str:
    return io_utils.join(plan.config.db, store.contained(rel))


def write_range_files(plan) -> str:
    """quantizer.faiss + range-<r>.faiss for r < R in this run's staging (local), from the trained index and
    the database's parts, holding one part and one range at a time; returns the directory."""
    out = index_dir(plan)
    if not io_utils.is_local(out):
        raise ConfigError(f"--ranges: the range files go to this run's staging ({out}), which must be local")
    os.makedirs(out, exist_ok=True)
    index = plan.db_manifest.index
    trained = io_utils.read_bytes(_db_file(plan, index["trained"]["path"]))
    parts = [s.index_part["path"] for s in plan.db_manifest.shards if s.index_part is not None]
    R = plan.config.ranges

    def put(name: str, payload: bytes) -> None:
        tmp = os.path.join(out, name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(payload)
        os.replace(tmp, os.path.join(out, name))

    put("quantizer.faiss", trained)  # trained, never filled: the coarse quantizer (and rotation) only
    for r in range(R):
        acc = retrieval_index.deserialize(trained)
        for rel in parts:
            acc.merge_from(retrieval_ranges.range_index(io_utils.read_bytes(_db_file(plan, rel)), r, R), 0)
        put(os.path.basename(sharded.range_file(out, r)), retrieval_index.serialize(acc))
        del acc
    return out


def search_config(plan, directory: str) -> sharded.ShardedSearch:
    icfg = retrieval_index.IndexConfig.from_dict(plan.db_manifest.index["config"])
    k = plan.spec.num_neighbours
    files = tuple((int(s.first_id), _db_file(plan, s.embeddings["path"])) for s in plan.db_manifest.shards
                  if s.embeddings is not None and s.embeddings.get("rows"))
    return sharded.ShardedSearch(directory, plan.config.ranges, k=k, num_candidates=max(k, icfg.rerank),
                                 nprobe=plan.config.nprobe or icfg.nprobe, vector_files=files)


class QueryVectors(PlanDoFn):
    """A dataset shard → (key, vector, exclusion) per non-padding chunk, encoded in the shard's fixed batches."""

    def setup(self):
        super().setup()
        import torch  # noqa: PLC0415

        torch.set_num_threads(1)  # one thread: the vectors' float sums do not depend on the worker's cores
        cfg = self.plan.config
        self.model = retrieval_encoders.load_minilm(cfg.device)
        self.sp = tokenizer.load_for_info(self.plan.model_bytes, self.plan.dataset.contract.tokenizer)

    def process(self, element):
        shard_idx, shard = element
        live = [((shard_idx, e, c.index), c) for e, ex in enumerate(shard_query_chunks(self.plan, shard))
                for c in ex if not c.is_padding]
        if not live:
            return
        texts = [self.sp.decode([int(t) for t in c.tokens]) for _, c in live]
        vecs = retrieval_encoders.minilm_encode(self.model, texts, self.plan.config.batch_size)
        # the database read by row group (db_rows): this worker holds one row group and this shard's queries
        excl = db_rows.exclusions(self.plan.config.db, self.plan.db_manifest, [c for _, c in live])
        for (key, c), v, e in zip(live, vecs, excl):
            yield key, np.asarray(v, np.float32), (e.ranges, e.ids)


class WriteShard(PlanDoFn):
    """(shard, {"shard": [dict], "rows": [((record, chunk), rows)]}) → the shard's sidecar file."""

    def setup(self):
        super().setup()
        self.pad_id = self.plan.dataset.contract.tokenizer.pad_id

    def process(self, element):
        shard_idx, grouped = element
        (shard,) = grouped["shard"]
        found = dict(grouped["rows"])
        k = self.plan.spec.num_neighbours
        none = (-1,) * k
        # only the rows this shard names and their continuations' rows, read by row group (db_rows)
        m = self.plan.db_manifest
        db = db_rows.NeededRows(self.plan.config.db, m, [i for rows in found.values() for i in rows],
                                -(-self.plan.spec.neighbour_len // m.chunk_len) + 1)

        def lookup(first, batch):
            return np.asarray([found.get((first + e, c.index), none) for e, ex in enumerate(batch) for c in ex],
                              np.int64).reshape(-1, k)

        yield neighbour_shard(self.plan, db, shard_idx, shard, self.pad_id, lookup)


def build_pipeline(p: beam.Pipeline, plan):
    search = search_config(plan, write_range_files(plan))
    shards = p | "ListShards" >> beam.Create([(i, s.to_dict()) for i, s in enumerate(plan.dataset.shards)])
    queries = (shards | "SpreadShards" >> beam.Reshuffle() | "QueryVectors" >> beam.ParDo(QueryVectors(plan)))
    rows = (sharded.search_queries(queries, search)
            | "ByShard" >> beam.Map(lambda kv: (kv[0][0], ((kv[0][1], kv[0][2]), kv[1]))))
    return ({"shard": shards, "rows": rows} | "JoinShard" >> beam.CoGroupByKey()
            | "WriteShards" >> beam.ParDo(WriteShard(plan))
            | "CollectSidecars" >> beam.combiners.ToList()
            | "Commit" >> beam.Map(commit_sidecar, plan))
