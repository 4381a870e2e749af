"""The data contract: what the shard producer and the trainer agree on, as plain JSON-able dataclasses.

A contract travels inside every manifest. The trainer builds an `Expectation` from its own config and calls
`check_compatible`, which lists *every* difference in one error, so a user fixes a config in one go.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Sequence

# 1.1: retrieval sidecars (model_contract/retrieval.py); shard features unchanged.
# 1.2: the tokenizer's format (SentencePiece, HF tokenizer.json, tiktoken), EOS text, special-token policy and
#      tiktoken's pattern/special tokens in TokenizerInfo; the dead-letter reason `pretoken_too_long`. A 1.1 reader
#      ignores the new fields (TokenizerInfo.from_dict reads the fields it knows); the filter reasons
#      near_duplicate, near_duplicate_of_committed and contaminated (--near-dedup, --decontaminate).
# 1.3: the dead-letter reason `tokenizer_panic` (a document the tokenizer's library panicked on,
#      transforms/tokenize/native.py); shard features and TokenizerInfo unchanged.
# 1.4: the dead-letter reason `tokenizer_drops_text` (a document whose ids do not hold all of its text: a tiktoken
#      --tokenizer-pattern that leaves part of it unmatched, transforms/tokenize/references.py lost_text).
CONTRACT_VERSION = "1.4"
SUPPORTED_MAJOR = 1

# Feature names. segment_ids: 0 = padding, 1..n = n-th document piece in the example; positions: position
# inside its piece (restarting at 0 for every piece); piece_doc_ids / piece_offsets: one entry per piece,
# the stable document id and the token offset of the piece inside its document (provenance).
INPUT_IDS = "input_ids"
SEGMENT_IDS = "segment_ids"
POSITIONS = "positions"
PIECE_DOC_IDS = "piece_doc_ids"
PIECE_OFFSETS = "piece_offsets"
NEIGHBOURS = "neighbours"
# Retrieval sidecar features (model_contract/retrieval.py): neighbour tokens as raw little-endian bytes of
# token_dtype, and the database chunk id (document id, chunk index) of every neighbour (-1 = none).
NEIGHBOUR_TOKENS = "neighbour_tokens"
NEIGHBOUR_DOC_IDS = "neighbour_doc_ids"
NEIGHBOUR_CHUNK_INDEX = "neighbour_chunk_index"


class ContractError(ValueError):
    """A contract or manifest that cannot be read (malformed, or a newer major version)."""


class ContractMismatchError(ValueError):
    """Data and trainer config disagree; `.mismatches` holds one line per difference."""

    def __init__(self, mismatches: Sequence[str]):
        self.mismatches = list(mismatches)
        lines = "\n".join(f"  - {m}" for m in self.mismatches)
        super().__init__(f"data does not match the trainer config ({len(self.mismatches)} mismatch"
                         f"{'es' if len(self.mismatches) != 1 else ''}):\n{lines}")


@dataclass(frozen=True)
class FeatureSpec:
    name: str
    dtype: str  # "int64" for every feature pileprep writes
    shape: tuple[Optional[int], ...]  # () scalar, (n,) fixed, (None,) variable length
    description: str = ""

    @property
    def is_fixed(self) -> bool:
        return all(d is not None for d in self.shape)

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "description": self.description}

    @classmethod
    def from_dict(cls, d: dict) -> "FeatureSpec":
        return cls(name=d["name"], dtype=d["dtype"], shape=tuple(d["shape"]), description=d.get("description", ""))


@dataclass(frozen=True)
class TokenizerInfo:
    kind: str  # the file's format: "sentencepiece", "hf-tokenizer-json" or "tiktoken"
    model_sha256: str  # of the tokenizer file (a directory's tokenizer.json)
    vocab_size: int
    bos_id: int
    eos_id: int  # the end-of-document id the job appends after every document
    pad_id: int  # the id written into padding positions (segment_ids == 0 marks them)
    unk_id: int
    # 1.2 (absent in 1.1 contracts: the defaults are what 1.1 data was, a SentencePiece model)
    eos_token: str = ""  # the text of eos_id in the vocabulary
    special_token_policy: str = "text"  # special tokens written in a document are encoded as its text
    special_tokens: dict[str, int] = dataclasses.field(default_factory=dict, hash=False)  # {text: id} of control tokens
    pattern: str = ""  # tiktoken: the split regex (the file does not carry it)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TokenizerInfo":
        fields = dataclasses.fields(cls)
        missing = [f.name for f in fields if f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING and f.name not in d]
        if missing:
            raise ContractError(f"the contract's tokenizer lacks {', '.join(missing)}")
        return cls(**{f.name: d[f.name] for f in fields if f.name in d})


@dataclass(frozen=True)
class RetrievalSpec:
    """RETRO-style retrieval shape: each training chunk of chunk_len tokens has k neighbours of neighbour_len.

    `fingerprint` names the database + encoder + index + neighbour settings the neighbours came from (empty in
    an Expectation = accept any); `token_dtype` is how neighbour token ids are stored (uint16 when the
    vocabulary fits, see model_contract/retrieval.py).
    """
    chunk_len: int
    num_neighbours: int
    neighbour_len: int
    fingerprint: str = ""
    token_dtype: str = "uint16"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RetrievalSpec":
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    def mismatches(self, expected: "RetrievalSpec") -> list:
        """What differs from an expectation (an empty expected fingerprint accepts any)."""
        out = [f"retrieval {name}: data has {getattr(self, name)}, trainer expects {getattr(expected, name)}"
               for name in ("chunk_len", "num_neighbours", "neighbour_len")
               if getattr(self, name) != getattr(expected, name)]
        if expected.fingerprint and expected.fingerprint != self.fingerprint:
            out.append(f"retrieval fingerprint: neighbours were built as {self.fingerprint or '(none)'}, trainer "
                       f"pins {expected.fingerprint} (rebuild with `pileprep retrieval neighbours` or unpin)")
        return out


def token_features(seq_len: int) -> tuple:
    """The features of one packed example, in the order the README documents them."""
    return (
        FeatureSpec(INPUT_IDS, "int64", (seq_len,), "token ids; documents end with EOS; padding = pad_id"),
        FeatureSpec(SEGMENT_IDS, "int64", (seq_len,), "0 = padding, 1..n = n-th document piece"),
        FeatureSpec(POSITIONS, "int64", (seq_len,), "position inside its document piece"),
        FeatureSpec(PIECE_DOC_IDS, "int64", (None,), "per piece: stable 63-bit document id"),
        FeatureSpec(PIECE_OFFSETS, "int64", (None,), "per piece: token offset of the piece in its document"),
    )


@dataclass(frozen=True)
class DataContract:
    seq_len: int
    tokenizer: TokenizerInfo
    features: tuple[FeatureSpec, ...] = ()
    retrieval: Optional[RetrievalSpec] = None
    version: str = CONTRACT_VERSION

    @classmethod
    def for_tokens(cls, seq_len: int, tokenizer: TokenizerInfo,
                   retrieval: Optional[RetrievalSpec] = None) -> "DataContract":
        features = token_features(seq_len)
        if retrieval is not None:
            n_chunks = seq_len // retrieval.chunk_len
            features += (FeatureSpec(NEIGHBOURS, "int64",
                                     (n_chunks, retrieval.num_neighbours, retrieval.neighbour_len),
                                     "retrieved neighbour tokens per chunk"),)
        return cls(seq_len=seq_len, tokenizer=tokenizer, features=features, retrieval=retrieval)

    def feature(self, name: str) -> FeatureSpec:
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {
            "version": self.version,
            "seq_len": self.seq_len,
            "tokenizer": self.tokenizer.to_dict(),
            "features": [f.to_dict() for f in self.features],
            "retrieval": self.retrieval.to_dict() if self.retrieval else None,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "DataContract":
        version = str(d.get("version", ""))
        check_version(version)
        return cls(
            seq_len=int(d["seq_len"]),
            tokenizer=TokenizerInfo.from_dict(d["tokenizer"]),
            features=tuple(FeatureSpec.from_dict(f) for f in d["features"]),
            retrieval=RetrievalSpec.from_dict(d["retrieval"]) if d.get("retrieval") else None,
            version=version,
        )


def check_version(version: str) -> None:
    try:
        major = int(version.split(".")[0])
    except ValueError:
        raise ContractError(f"contract version {version!r} is not of the form MAJOR.MINOR") from None
    if major > SUPPORTED_MAJOR:
        raise ContractError(
            f"data was written with contract version {version}, newer than this reader understands "
            f"(major {SUPPORTED_MAJOR}); upgrade pileprep on the reading side")


@dataclass(frozen=True)
class Expectation:
    """What a consumer (the trainer) needs from the data, built from its own config."""
    seq_len: int
    vocab_size: int  # the model's embedding rows; must cover every token id the tokenizer can emit
    required_features: tuple[str, ...] = (INPUT_IDS, SEGMENT_IDS, POSITIONS)
    tokenizer_sha256: Optional[str] = None  # pin a tokenizer, or None to accept any
    retrieval: Optional[RetrievalSpec] = None  # required retrieval shape, or None when not retrieval-augmented


def check_compatible(contract_or_manifest: Any, expected: Expectation) -> DataContract:
    """Return the data's contract, or raise ContractMismatchError naming every mismatch.

    Accepts a DataContract, a Manifest, or their dict forms.
    """
    contract = _as_contract(contract_or_manifest)
    problems: list[str] = []
    if contract.seq_len != expected.seq_len:
        problems.append(f"seq_len: data has {contract.seq_len}, trainer config has {expected.seq_len} "
                        f"(set the model's seq_len to {contract.seq_len} or re-shard with --seq-len "
                        f"{expected.seq_len})")
    if contract.tokenizer.vocab_size > expected.vocab_size:
        problems.append(f"vocab_size: tokenizer emits ids up to {contract.tokenizer.vocab_size - 1}, "
                        f"trainer's vocab_size is {expected.vocab_size} (needs >= "
                        f"{contract.tokenizer.vocab_size})")
    if expected.tokenizer_sha256 and expected.tokenizer_sha256 != contract.tokenizer.model_sha256:
        problems.append(f"tokenizer: data was tokenized with sha256 {contract.tokenizer.model_sha256[:12]}…, "
                        f"trainer pins {expected.tokenizer_sha256[:12]}…")
    names = {f.name: f for f in contract.features}
    for name in expected.required_features:
        spec = names.get(name)
        if spec is None:
            problems.append(f"feature {name!r}: missing from data (data has {sorted(names)})")
        elif spec.dtype != "int64" and name != NEIGHBOUR_TOKENS:
            problems.append(f"feature {name!r}: dtype {spec.dtype}, trainer reads int64")
        elif name in (INPUT_IDS, SEGMENT_IDS, POSITIONS) and tuple(spec.shape) != (expected.seq_len,):
            problems.append(f"feature {name!r}: shape {list(spec.shape)}, trainer expects [{expected.seq_len}]")
    if expected.retrieval is not None:
        if contract.retrieval is None:
            problems.append("retrieval: trainer expects neighbours but the data has no retrieval features")
        else:
            problems.extend(contract.retrieval.mismatches(expected.retrieval))
    if problems:
        raise ContractMismatchError(problems)
    return contract


def _as_contract(obj: Any) -> DataContract:
    if isinstance(obj, DataContract):
        return obj
    if hasattr(obj, "contract") and isinstance(obj.contract, DataContract):
        return obj.contract
    if isinstance(obj, dict):
        return DataContract.from_dict(obj["contract"] if "contract" in obj else obj)
    raise TypeError(f"expected a DataContract, Manifest or dict, got {type(obj).__name__}")


def tf_feature_spec(contract: DataContract) -> dict:
    """`tf.io.parse_example` spec for the contract's features (imports TensorFlow lazily)."""
    import tensorflow as tf  # noqa: PLC0415 - only tf.data users pay for the import

    spec: dict[str, Any] = {}
    for f in contract.features:
        dtype = {"int64": tf.int64, "float32": tf.float32}[f.dtype]
        if f.is_fixed:
            spec[f.name] = tf.io.FixedLenFeature(list(f.shape), dtype)
        else:
            spec[f.name] = tf.io.VarLenFeature(dtype)
    return spec

