"""Near-duplicate detection as pure functions (no Beam): the shard job's near-dedup stage
(pipeline/shard/near_dedup/) and bench/near_dedup_bench.py call these, so they can be tested and
benchmarked without a runner. One module per job:

- hashing.py: the fixed 64-bit mix every hash here is built from, and the optional C extension's handle.
- shingling.py: word 5-grams of normalised text, or token n-grams of the ids, hashed to 64 bits.
- minhash.py: signatures (one-permutation hashing or classic MinHash), LSH band keys, Jaccard, the S-curve.
- clusters.py: the graph's nodes, star edges of a band bucket, label propagation, the keeper rule.
- band_index.py: a generation's committed band index (for --incremental).
- removals.py: the removal lists the stage stages for the packers, and the packers' lookup.
"""
