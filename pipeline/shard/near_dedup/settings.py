"""What the job's config asks of the near-dedup and decontamination stage (Beam-free): the nested, typed view
of ShardConfig's `near_dedup*` and `decontaminate*` fields, whether the stage runs, and whether the tokenize
stage signs documents for it.

The flat fields stay the command line's, the TOML file's and the fingerprint's surface (pipeline/options.py
derives one option per field; ShardConfig.to_manifest_dict hashes them as they are, so generation names do not
move); every stage reads them through `config.near_dedup_config` and `config.decontaminate_config`.

Kept out of the stage's Beam wiring (transform.py) so that the modules that only need these answers - the
config, the resume markers (pipeline/shard/resume.py), the graph builder - do not import the stage, which
imports them back (that closed the cycle ops/guards -> shard/integrity -> the near-dedup graph -> shard/resume
-> ops/guards).
"""
from __future__ import annotations

import typing
from dataclasses import dataclass

from transforms.shard import decontaminate
from transforms.shard.documents import SPLITS
from transforms.shard.near_dedup import clusters, minhash, shingling


@dataclass(frozen=True)
class NearDedupConfig:
    """`--near-dedup` and its `--near-dedup-*` options (docs/NEAR_DEDUP.md)."""
    enabled: bool = False
    bands: int = minhash.DEFAULT_BANDS
    rows: int = minhash.DEFAULT_ROWS
    threshold: float = minhash.DEFAULT_THRESHOLD
    verify: bool = False  # exact Jaccard of each candidate pair (shingles staged)
    shingles: str = shingling.DEFAULT_SHINGLES  # shingling.SHINGLE_KINDS
    rounds: int = clusters.DEFAULT_ROUNDS
    seed: int = 0  # the job's --seed: it seeds the sketch

    @classmethod
    def of(cls, config) -> "NearDedupConfig":
        return cls(bool(config.near_dedup), config.near_dedup_bands, config.near_dedup_rows,
                   config.near_dedup_threshold, bool(config.near_dedup_verify), config.near_dedup_shingles,
                   config.near_dedup_rounds, config.seed)

    @property
    def params(self) -> minhash.MinHashParams:
        return minhash.MinHashParams(self.bands, self.rows, self.seed, shingles=self.shingles)


@dataclass(frozen=True)
class DecontaminateConfig:
    """`--decontaminate GLOB` and its `--decontaminate-*` options (transforms/shard/decontaminate.py)."""
    globs: tuple[str, ...] = ()  # evaluation files or globs
    field: str = "text"
    ngram: int = decontaminate.DEFAULT_NGRAM
    held_out: bool = False  # val/test documents are checked too

    @classmethod
    def of(cls, config) -> "DecontaminateConfig":
        return cls(tuple(config.decontaminate), config.decontaminate_field, config.decontaminate_ngram,
                   bool(config.decontaminate_held_out))

    @property
    def enabled(self) -> bool:
        return bool(self.globs)

    @property
    def checked_splits(self) -> list:
        """The splits whose documents are checked against the evaluation sets: train, or all with held_out."""
        return list(range(len(SPLITS))) if self.held_out else [0]


def enabled(config) -> bool:
    """Whether the job has the stage at all (near-dedup, decontamination or both)."""
    return config.near_dedup_config.enabled or config.decontaminate_config.enabled


def tokenize_signing(config) -> typing.Optional[minhash.MinHashParams]:
    """The params the tokenize stage signs documents with (transforms/shard/tokenize_unit.py TokenizeSettings), or
    None: only word shingles without --near-dedup-verify (shingles to stage) or --decontaminate (text to read),
    where the signatures are all this stage needs of the text. Re-reading and parsing the unit's chunk was a
    fifth of near-dedup's CPU on distinct text (docs/NEAR_DEDUP.md "Cost")."""
    near = config.near_dedup_config
    if not near.enabled or near.verify or config.decontaminate_config.enabled:
        return None
    params = near.params
    return params if params.shingles == "words" and params.sketch == "oph" else None
