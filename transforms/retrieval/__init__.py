"""Retrieval corpora as pure functions: chunks from shard provenance, encoders, neighbour search."""
