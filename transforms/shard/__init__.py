"""The shard job's stages as pure functions: documents, dedup ids, splits, mixture, packing, spill, shuffle."""
