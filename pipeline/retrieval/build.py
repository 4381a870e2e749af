"""`pileprep retrieval build`: a committed shard dataset → chunk database (+ embeddings + index) → manifest.

Documents are re-assembled from the shards' provenance (`piece_doc_ids` / `piece_offsets`), so the database
holds exactly the tokens the trainer sees, with no second tokenization. Each document's source is joined from
the dataset's input files (a JSON parse, no tokenizing). This module is the graph, read top to bottom; its steps
are in pipeline/retrieval/build_plan.py (the plan), build_read.py (read, join, write the database shards),
build_index.py (embeddings and the Faiss or BM25 index) and build_manifest.py (reconcile, manifest, commit); the
work itself in transforms/retrieval/ (chunks, encoders, index).
"""
from __future__ import annotations

import apache_beam as beam

from pipeline import job
from pipeline.beam_glue import GatherAll
from pipeline.ops import commit
from pipeline.retrieval import store, store_job
from pipeline.retrieval.build_index import EncodeShard, MiniLMHandler, build_bm25, fill_part, train_index
from pipeline.retrieval.build_manifest import commit_db
from pipeline.retrieval.build_plan import BuildPlan, prepare
from pipeline.retrieval.build_read import PIECE, READ_TOTALS, ReadPieces, ReadSources, WriteDbShard, assemble, of_kind
from pipeline.retrieval.config import BuildConfig
from transforms.retrieval import retrieval_chunks, retrieval_encoders


def build_pipeline(p: beam.Pipeline, plan: BuildPlan):
    # The database's steps (read, join, write, BM25, commit) run on DaskRunner too, which computes only the last
    # step's graph, re-computes a side input inside each consumer, and mixes a ParDo's tagged outputs into its
    # main one (pipeline/shard/graph.py's rule): so no side input, no `with_outputs` and no CombineGlobally there;
    # lists are gathered by a GroupByKey (beam_glue.GatherAll) and joined to the commit by key.
    cfg = plan.config
    read = (p | "ListShards" >> beam.Create(list(plan.shard_paths)) | "SpreadShards" >> beam.Reshuffle()
            | "ReadPieces" >> beam.ParDo(ReadPieces(plan)))
    pieces = read | "Pieces" >> beam.FlatMap(of_kind, PIECE)
    totals = read | "ReadTotals" >> beam.FlatMap(of_kind, READ_TOTALS)
    sources = (p | "ListInputs" >> beam.Create(list(plan.input_paths)) | "SpreadInputs" >> beam.Reshuffle()
               | "ReadSources" >> beam.ParDo(ReadSources(plan)))
    documents = ({"pieces": pieces, "sources": sources} | "JoinByDocument" >> beam.CoGroupByKey()
                 | "Assemble" >> beam.FlatMap(assemble))
    # every database shard number joined in, so a shard no document fell into still gets its (empty) file
    shard_numbers = p | "ListDbShards" >> beam.Create([(k, k) for k in range(cfg.num_db_shards)])
    written = ({"documents": documents | "KeyByDbShard" >> beam.Map(
                    lambda d: (retrieval_chunks.db_shard_of(d[0], cfg.num_db_shards), d)),
                "shard": shard_numbers} | "GroupDbShard" >> beam.CoGroupByKey()
               | "ShardDocuments" >> beam.Map(lambda kv: (kv[0], kv[1]["documents"]))
               | "WriteDbShards" >> beam.ParDo(WriteDbShard(plan)))
    all_results = written | "CollectAllShards" >> GatherAll()
    if cfg.encoder == retrieval_encoders.BM25:
        bm25 = all_results | "BuildBM25" >> beam.Map(build_bm25, plan)
        return ({"results": all_results | "KeyResults" >> beam.Map(lambda x: (0, x)),
                 "bm25": bm25 | "KeyBM25" >> beam.Map(lambda x: (0, x)),
                 "totals": totals | "KeyTotals" >> beam.Map(lambda x: (0, x))} | "JoinForCommit" >> beam.CoGroupByKey()
                | "Commit" >> beam.Map(commit_joined, plan))
    read_totals = beam.pvalue.AsList(totals)
    # one element per database shard, encoded and written where it is read: no vector crosses a shuffle
    # (build_index.EncodeShard: the per-shard GroupByKey of every vector grew a worker's peak with the shards)
    embeddings = (written
                  | "SpreadDbShards" >> beam.Reshuffle()
                  | "EncodeShards" >> beam.ParDo(EncodeShard(plan, MiniLMHandler(cfg.device, cfg.batch_size))))
    emb_list = embeddings | "CollectEmbeddings" >> beam.combiners.ToList()
    trained = all_results | "TrainIndex" >> beam.Map(train_index, beam.pvalue.AsSingleton(emb_list), plan)
    parts = (embeddings | "FillIndexParts" >> beam.Map(fill_part, plan, beam.pvalue.AsSingleton(trained),
                                                       beam.pvalue.AsSingleton(all_results))
             | "CollectParts" >> beam.combiners.ToList())
    return all_results | "Commit" >> beam.Map(commit_db, plan, beam.pvalue.AsSingleton(emb_list),
                                              beam.pvalue.AsSingleton(trained), beam.pvalue.AsSingleton(parts),
                                              read_totals=read_totals)


def commit_joined(element, plan: BuildPlan):
    """The BM25 database's commit from its one joined element: every shard's result, the postings, the totals."""
    joined = element[1]
    return commit_db(joined["results"][0], plan, trained=joined["bm25"][0], read_totals=joined["totals"])


def job_for(config: BuildConfig, beam_args=None) -> "store_job.StoreJob":
    """The build as a job for the job runner (pipeline/job.py): lock, cleanup, commit checks."""
    return store_job.StoreJob(config, beam_args, commit.KIND_RETRIEVAL_DB, "chunk database", store.DB_FORMAT,
                              prepare, build_pipeline)


def run_outcome(config: BuildConfig, beam_args=None) -> job.JobOutcome:
    """Build and commit the chunk database; the outcome pipeline/retrieval/cli.py formats."""
    return job.run_job(job_for(config, beam_args))


def run(config: BuildConfig, beam_args=None) -> dict:
    """Build and commit the chunk database; returns its manifest."""
    return run_outcome(config, beam_args).manifest
