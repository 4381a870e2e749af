"""`pileprep retrieval build`, its read and write stages: shards → document pieces (with per-file totals for the
reconciliation), input files → each document's source, pieces and sources joined into documents, and documents →
the database's Parquet shards. Every name and order derives from document ids and the config, so the database is
byte-identical for any number of workers and any runner.
"""
from __future__ import annotations

import logging

import numpy as np

from model_contract import decode_example
from model_contract.checked_reader import iter_checked_records
from pipeline.beam_glue import PlanDoFn
from pipeline.ops.output_names import shard_entry
from pipeline.retrieval import store
from transforms.io import io_utils
from transforms.io.read_records import FileDamage, compression_of, iter_raw_records
from transforms.retrieval import retrieval_chunks
from transforms.shard.documents import DEAD_LETTER, FILTERED, parse_record

LOG = logging.getLogger("pileprep.retrieval")
UNKNOWN_SOURCE = ""

# ReadPieces' one output carries two kinds, split by `of_kind` (pipeline/retrieval/build.py), not a tagged
# second output: Beam's DaskRunner (2.77, runners/dask/transform_evaluator.py) keeps one bag per ParDo with every
# tagged output in it, so a `with_outputs` consumer there read the totals dicts as pieces (JoinByDocument failed:
# "add_tag.<locals>.<lambda>() takes 2 positional arguments but 4 were given", a dict of 4 keys unpacked).
PIECE = "piece"
READ_TOTALS = "read_totals"


class ReadPieces(PlanDoFn):
    """One shard file → (PIECE, (doc_id, (offset, tokens))) for every document piece in it, and one
    (READ_TOTALS, {"path", "pieces", "tokens", "documents"}) for the file: what the database must account for
    (reconcile). A document's piece at offset 0 counts it once."""

    def process(self, path):
        fraction = self.plan.config.doc_fraction
        limit = int(fraction * retrieval_chunks.DOC_ID_SPACE)
        pieces = tokens = documents = 0
        with io_utils.open_read(path) as f:
            for record in iter_checked_records(f, shard_entry(self.plan.dataset_manifest, self.plan.config.dataset,
                                                              path)):
                for piece in retrieval_chunks.pieces_of_example(decode_example(record)):
                    if fraction < 1.0 and piece.doc_id >= limit:
                        continue
                    pieces += 1
                    tokens += len(piece.tokens)
                    documents += int(piece.offset == 0)
                    yield PIECE, (piece.doc_id, (piece.offset, piece.tokens.astype(np.int32)))
        yield READ_TOTALS, {"path": path, "pieces": pieces, "tokens": tokens, "documents": documents}


def of_kind(element, kind: str):
    """ReadPieces' elements of one kind (PIECE or READ_TOTALS), unwrapped."""
    if element[0] == kind:
        yield element[1]


class ReadSources(PlanDoFn):
    """One input file → (doc_id, source) for every document in it (damaged lines are the shard job's business)."""

    def process(self, path):
        cfg = self.plan.dataset_manifest["config"]
        text_field = cfg.get("text_field", "text")
        source_fields = tuple(cfg.get("source_fields", ("meta.pile_set_name",)))
        try:
            stream = io_utils.open_read(path)
        except Exception as e:  # noqa: BLE001 - a moved input only costs the source column
            LOG.warning("%s: cannot read it for sources (%s); its documents get source ''", path, e)
            return
        with stream:
            for item in iter_raw_records(stream, compression_of(path)):
                if isinstance(item, FileDamage):
                    continue
                doc = parse_record(item.data, text_field, source_fields)
                if getattr(doc, "kind", None) in (FILTERED, DEAD_LETTER):
                    continue
                yield doc.doc_id, doc.source


def assemble(element):
    doc_id, grouped = element
    pieces, sources = grouped["pieces"], grouped["sources"]
    if not pieces:
        return  # a document of another split, or filtered out of the dataset
    tokens = retrieval_chunks.assemble_document(doc_id, pieces)
    source = min(sources) if sources else UNKNOWN_SOURCE  # duplicates under two sources: one deterministic pick
    yield doc_id, source, tokens


class WriteDbShard(PlanDoFn):
    """One database shard's documents → its Parquet file; yields the shard's manifest entry."""

    def process(self, element):
        k, documents = element
        cfg = self.plan.config
        rows = retrieval_chunks.db_rows(documents, cfg.chunk_len)
        rel = f"{self.plan.generation}/" + store.shard_name("chunks", k, cfg.num_db_shards, "parquet")
        nbytes, sha = store.write_parquet(io_utils.join(cfg.output, rel), rows)
        sources: dict = {}
        for s, toks, ci in zip(rows["source"], rows["tokens"], rows["chunk_index"]):
            d = sources.setdefault(s, {"documents": 0, "chunks": 0, "tokens": 0})
            d["chunks"] += 1
            d["tokens"] += len(toks)
            d["documents"] += int(ci == 0)
        yield {"shard": k, "path": rel, "chunks": len(rows["doc_id"]), "documents": len(set(rows["doc_id"])),
               "tokens": int(sum(len(t) for t in rows["tokens"])), "bytes": nbytes, "sha256": sha,
               "sources": sources}
