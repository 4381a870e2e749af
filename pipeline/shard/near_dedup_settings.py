"""What the job's config asks of the near-dedup stage (Beam-free): whether it runs, its MinHash parameters, and
whether the tokenize stage signs documents for it.

Kept out of pipeline/shard/near_dedup_graph.py (the stage's Beam wiring) so that the modules that only need these
answers - the resume markers (pipeline/shard/resume.py), the graph builder - do not import the stage, which
imports them back (that closed the cycle ops/guards -> shard/integrity -> shard/near_dedup_graph ->
shard/resume -> ops/guards).
"""
from __future__ import annotations

import typing

from transforms.shard import near_dedup


def enabled(config) -> bool:
    return bool(config.near_dedup or config.decontaminate)


def params_of(config) -> near_dedup.MinHashParams:
    return near_dedup.MinHashParams(config.near_dedup_bands, config.near_dedup_rows, config.seed,
                                    shingles=getattr(config, "near_dedup_shingles", near_dedup.DEFAULT_SHINGLES))


def tokenize_signing(config) -> typing.Optional[near_dedup.MinHashParams]:
    """The params the tokenize stage signs documents with (transforms/shard/stages.py TokenizeSettings), or
    None: only word shingles without --near-dedup-verify (shingles to stage) or --decontaminate (text to read),
    where the signatures are all this stage needs of the text. Re-reading and parsing the unit's chunk was a
    fifth of near-dedup's CPU on distinct text (docs/NEAR_DEDUP.md "Cost")."""
    if not config.near_dedup or config.near_dedup_verify or config.decontaminate:
        return None
    params = params_of(config)
    return params if params.shingles == "words" and params.sketch == "oph" else None
