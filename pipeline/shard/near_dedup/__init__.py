"""The shard job's near-dedup and decontamination stage (Beam wiring); the pure logic is in
transforms/shard/near_dedup/ and transforms/shard/decontaminate.py. One module per job:

- transform.py: the NearDedup PTransform, the stage's graph read top to bottom.
- elements.py: the typed records its steps hand each other.
- settings.py: the typed view of the options (NearDedupConfig, DecontaminateConfig); Beam-free.
- manifest.py: what the stage leaves in the manifest; Beam-free.
- sign.py, unit_docs.py, eval_sets.py: signing a unit's documents, reading them, the evaluation sets.
- band_files.py, windows.py, committed.py: staged band rows, read a window of keys at a time, and the committed
  generations' band index files (--incremental).
- edges.py, labels.py: candidate edges, connected components by label propagation.
- partitions.py, band_index_writer.py: the removals, the summary and markers, the generation's band index.

This file imports nothing, so the Beam-free modules can be imported without Beam (pipeline/shard/resume.py,
pipeline/shard/integrity.py, pipeline/config.py).
"""
