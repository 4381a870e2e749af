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
from apache_beam.ml.inference.base import KeyedModelHandler, RunInference

from pipeline import job
from pipeline.ops import commit
from pipeline.retrieval import store, store_job
from pipeline.retrieval.build_index import (ChunkTexts, MiniLMHandler, build_bm25, fill_part, train_index,
                                            write_embeddings)
from pipeline.retrieval.build_manifest import commit_db
from pipeline.retrieval.build_plan import BuildPlan, prepare
from pipeline.retrieval.build_read import (PIECE, READ_TOTALS, ReadPieces, ReadSources, WriteDbShard, assemble,
                                          empty_shards, of_kind)
from pipeline.retrieval.config import BuildConfig
from transforms.retrieval import retrieval_chunks, retrieval_encoders


def build_pipeline(p: beam.Pipeline, plan: BuildPlan):
    cfg = plan.config
    read = (p | "ListShards" >> beam.Create(list(plan.shard_paths)) | "SpreadShards" >> beam.Reshuffle()
            | "ReadPieces" >> beam.ParDo(ReadPieces(plan)))
    # one output split in two, not `with_outputs`: DaskRunner mixes tagged outputs (build_read.py, PIECE)
    pieces = read | "Pieces" >> beam.FlatMap(of_kind, PIECE)
    read_totals = beam.pvalue.AsList(read | "ReadTotals" >> beam.FlatMap(of_kind, READ_TOTALS))
    sources = (p | "ListInputs" >> beam.Create(list(plan.input_paths)) | "SpreadInputs" >> beam.Reshuffle()
               | "ReadSources" >> beam.ParDo(ReadSources(plan)))
    documents = ({"pieces": pieces, "sources": sources} | "JoinByDocument" >> beam.CoGroupByKey()
                 | "Assemble" >> beam.FlatMap(assemble))
    written = (documents
               | "KeyByDbShard" >> beam.Map(lambda d: (retrieval_chunks.db_shard_of(d[0], cfg.num_db_shards), d))
               | "GroupDbShard" >> beam.GroupByKey()
               | "WriteDbShards" >> beam.ParDo(WriteDbShard(plan)))
    results = written | "CollectShards" >> beam.combiners.ToList()
    empties = (results | "EmptyShards" >> beam.FlatMap(empty_shards, cfg.num_db_shards)
               | "WriteEmptyShards" >> beam.ParDo(WriteDbShard(plan)))
    all_results = ((written, empties) | "AllShards" >> beam.Flatten()
                   | "CollectAllShards" >> beam.combiners.ToList())
    if cfg.encoder == retrieval_encoders.BM25:
        bm25 = all_results | "BuildBM25" >> beam.Map(build_bm25, plan)
        return all_results | "Commit" >> beam.Map(commit_db, plan, trained=beam.pvalue.AsSingleton(bm25),
                                                  read_totals=read_totals)
    handler = KeyedModelHandler(MiniLMHandler(cfg.device, cfg.batch_size))
    embeddings = ((written, empties) | "ShardsToEncode" >> beam.Flatten()
                  | "ChunkTexts" >> beam.ParDo(ChunkTexts(plan))
                  | "SpreadTexts" >> beam.Reshuffle()
                  | "Encode" >> RunInference(handler)
                  | "ByShard" >> beam.Map(lambda kv: (kv[0][0], (kv[0][1], kv[1].inference)))
                  | "GroupVectors" >> beam.GroupByKey()
                  | "WriteEmbeddings" >> beam.Map(write_embeddings, plan))
    emb_list = embeddings | "CollectEmbeddings" >> beam.combiners.ToList()
    trained = all_results | "TrainIndex" >> beam.Map(train_index, beam.pvalue.AsSingleton(emb_list), plan)
    parts = (embeddings | "FillIndexParts" >> beam.Map(fill_part, plan, beam.pvalue.AsSingleton(trained),
                                                       beam.pvalue.AsSingleton(all_results))
             | "CollectParts" >> beam.combiners.ToList())
    return all_results | "Commit" >> beam.Map(commit_db, plan, beam.pvalue.AsSingleton(emb_list),
                                              beam.pvalue.AsSingleton(trained), beam.pvalue.AsSingleton(parts),
                                              read_totals=read_totals)


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
