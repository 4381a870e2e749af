"""Retrieval-context corpora: chunk database, encoders + index, neighbours per training chunk."""
