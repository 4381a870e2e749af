"""model_contract: the versioned agreement between pileprep's shard producer and its trainer.

Dependency-light on purpose (numpy only; google-crc32c is used when installed, model_contract/crc32c.py): the
trainer imports it without Beam or TensorFlow. `tf_feature_spec` imports TensorFlow lazily for tf.data users.
"""
from model_contract.contract import (CONTRACT_VERSION, INPUT_IDS, NEIGHBOURS, PIECE_DOC_IDS, PIECE_OFFSETS,
                                     POSITIONS, SEGMENT_IDS, ContractError, ContractMismatchError,
                                     DataContract, Expectation, FeatureSpec, RetrievalSpec, TokenizerInfo,
                                     check_compatible, tf_feature_spec)
from model_contract.example_codec import decode_example, encode_example, frame_examples
from model_contract.dataset_paths import MANIFEST_NAME, manifest_path, resolve_shard_path
from model_contract.manifest import Manifest, load_manifest
from model_contract.manifest_rows import ShardInfo
from model_contract.tfrecord import TFRecordCorruptError, frame_record, iter_records, read_records

__all__ = [
    "CONTRACT_VERSION", "INPUT_IDS", "NEIGHBOURS", "PIECE_DOC_IDS", "PIECE_OFFSETS", "POSITIONS", "SEGMENT_IDS",
    "ContractError", "ContractMismatchError", "DataContract", "Expectation", "FeatureSpec", "RetrievalSpec",
    "TokenizerInfo", "check_compatible", "tf_feature_spec", "decode_example", "encode_example", "frame_examples",
    "MANIFEST_NAME", "Manifest", "ShardInfo", "load_manifest", "manifest_path", "resolve_shard_path",
    "TFRecordCorruptError", "frame_record", "iter_records", "read_records",
]
