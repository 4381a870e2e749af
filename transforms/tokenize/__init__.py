"""Tokenizers: loading a model once per worker, and exact fast backends checked against it."""
