"""model_contract: codecs agree with TensorFlow, JSON round trips, compatibility errors list every mismatch."""
import io
import json

import numpy as np
import pytest

from model_contract import (Manifest, ShardInfo, TFRecordCorruptError, decode_example, encode_example, frame_record,
                            iter_records)
from model_contract.contract import (ContractError, ContractMismatchError, DataContract, Expectation, RetrievalSpec,
                                     TokenizerInfo, check_compatible, tf_feature_spec)
from model_contract.example_codec import decode_varints, encode_varints
from model_contract.tfrecord import masked_crc32c

TOK = TokenizerInfo("sentencepiece", "ab" * 32, 1000, 2, 3, 0, 1)


def test_varints_round_trip_edge_values():
    values = np.array([0, 1, 127, 128, 16383, 16384, 2 ** 31, 2 ** 62, 2 ** 63 - 1, -1, -(2 ** 63)], dtype=np.int64)
    assert (decode_varints(encode_varints(values)) == values).all()
    rng = np.random.default_rng(0)
    random = rng.integers(-2 ** 63, 2 ** 63 - 1, 5000, dtype=np.int64)
    assert (decode_varints(encode_varints(random)) == random).all()


def test_example_codec_matches_tensorflow_both_ways():
    tf = pytest.importorskip("tensorflow")
    feats = {"input_ids": np.arange(40) * 997, "segment_ids": np.ones(40, dtype=np.int64),
             "piece_doc_ids": np.array([2 ** 62 + 7]), "empty": np.zeros(0, dtype=np.int64)}
    ours = encode_example(feats)
    parsed = tf.train.Example.FromString(ours)
    for k, v in feats.items():
        assert list(parsed.features.feature[k].int64_list.value) == v.tolist()
    back = decode_example(parsed.SerializeToString())
    for k, v in feats.items():
        assert (back[k] == v).all()


def test_tfrecord_framing_read_by_tf_data_and_corruption_detected(tmp_path):
    tf = pytest.importorskip("tensorflow")
    payloads = [encode_example({"x": np.arange(i + 1)}) for i in range(5)]
    path = tmp_path / "a.tfrecord"
    path.write_bytes(b"".join(frame_record(p) for p in payloads))
    assert [bytes(r.numpy()) for r in tf.data.TFRecordDataset(str(path))] == payloads
    assert list(iter_records(io.BytesIO(path.read_bytes()))) == payloads
    damaged = bytearray(path.read_bytes())
    damaged[30] ^= 0xFF
    with pytest.raises(TFRecordCorruptError):
        list(iter_records(io.BytesIO(bytes(damaged))))
    with pytest.raises(TFRecordCorruptError):
        list(iter_records(io.BytesIO(path.read_bytes()[:-3])))


def test_contract_json_round_trip_and_tf_spec():
    c = DataContract.for_tokens(64, TOK, RetrievalSpec(16, 2, 32))
    again = DataContract.from_dict(json.loads(json.dumps(c.to_dict())))
    assert again == c
    assert c.feature("neighbours").shape == (4, 2, 32)
    pytest.importorskip("tensorflow")
    spec = tf_feature_spec(c)
    assert spec["input_ids"].shape == [64] and type(spec["piece_doc_ids"]).__name__ == "VarLenFeature"


def test_check_compatible_lists_every_mismatch():
    manifest = Manifest(contract=DataContract.for_tokens(64, TOK), shards=[ShardInfo("a", "train", 1, 1, 0, 1, 1, "x")])
    assert check_compatible(manifest, Expectation(seq_len=64, vocab_size=1024)) == manifest.contract
    with pytest.raises(ContractMismatchError) as err:
        check_compatible(manifest.to_dict(), Expectation(seq_len=128, vocab_size=512, tokenizer_sha256="cd" * 32,
                                                         required_features=("input_ids", "labels"),
                                                         retrieval=RetrievalSpec(64, 2, 128)))
    text = str(err.value)
    assert len(err.value.mismatches) == 6
    for word in ("seq_len", "vocab_size", "tokenizer", "'labels'", "input_ids", "retrieval"):
        assert word in text


def test_newer_major_version_is_refused_clearly():
    d = DataContract.for_tokens(8, TOK).to_dict()
    d["version"] = "2.0"
    with pytest.raises(ContractError, match="newer than this reader"):
        DataContract.from_dict(d)


def test_manifest_json_is_canonical():
    m = Manifest(contract=DataContract.for_tokens(8, TOK), shards=[], generation="gen-" + "0" * 16,
                 extra={"later_section": {"k": 2}})  # a section this reader does not know
    assert Manifest.from_json(m.to_json()).to_json() == m.to_json()
    assert Manifest.from_json(m.to_json()).generation == "gen-" + "0" * 16
    assert Manifest.from_json(m.to_json()).extra == {"later_section": {"k": 2}}


def test_c_accelerator_and_numpy_paths_give_identical_bytes():
    from model_contract import example_codec

    if example_codec._fast is None:
        pytest.skip("model_contract._varint was not built (no compiler): only the numpy path exists here")
    rng = np.random.default_rng(7)
    for values in (rng.integers(-2 ** 63, 2 ** 63 - 1, 4000, dtype=np.int64), np.arange(5000),
                   rng.integers(0, 32000, 2048).astype(np.int32), np.zeros(0, dtype=np.int64)):
        fast = example_codec.encode_varints(values)
        assert fast == example_codec._encode_varints_numpy(values)
        assert (example_codec.decode_varints(fast) == values).all()
        assert (example_codec._decode_varints_numpy(fast) == values).all()
    for broken in (b"\x80", b"\x05\xff"):
        with pytest.raises(ValueError):
            example_codec.decode_varints(broken)
        with pytest.raises(ValueError):
            example_codec._decode_varints_numpy(broken)


def test_whole_example_c_encoder_and_python_path_give_identical_bytes(monkeypatch):
    from model_contract import example_codec

    if example_codec._fast is None:
        pytest.skip("model_contract._varint was not built (no compiler): only the numpy path exists here")
    rng = np.random.default_rng(11)
    cases = [{"input_ids": rng.integers(0, 32000, n), "segment_ids": rng.integers(0, 9, n).astype(np.int32),
              "positions": np.arange(n), "piece_doc_ids": rng.integers(-2 ** 63, 2 ** 63 - 1, k, dtype=np.int64),
              "piece_offsets": rng.integers(-3, 1 << 40, k)}
             for n, k in ((0, 0), (1, 1), (127, 2), (128, 3), (2048, 4), (20000, 1))]
    cases.append({"a" * 200: np.arange(300), "": np.zeros(0, dtype=np.int64)})  # long and empty names
    fast = [example_codec.encode_example(c) for c in cases]
    monkeypatch.setattr(example_codec, "_fast", None)
    assert fast == [example_codec.encode_example(c) for c in cases]
    for c, data in zip(cases, fast):
        back = example_codec.decode_example(data)
        assert sorted(back) == sorted(c) and all((back[k] == v).all() for k, v in c.items())


def test_framed_block_of_examples_is_each_example_framed_by_the_python_path(monkeypatch, tmp_path):
    """frame_examples (one C call per block, without the GIL; its own CRC-32C) writes exactly the bytes of
    frame_record(encode_example(...)) per example on the numpy path, and tf.data reads them."""
    from model_contract import example_codec, frame_examples

    if example_codec._fast is None:
        pytest.skip("model_contract._varint was not built (no compiler): only the numpy path exists here")
    rng = np.random.default_rng(13)
    blocks = []
    for n, seq_len in ((0, 4), (1, 1), (3, 7), (40, 2048)):
        pieces = rng.integers(0, 5, n)  # examples with no piece at all, too (a padding-only example is never made,
        splits = np.concatenate(([0], np.cumsum(pieces)))  # but the encoder must not care)
        dense = np.arange(0, (n + 1) * seq_len, seq_len)
        blocks.append(({"input_ids": (rng.integers(0, 1 << 20, n * seq_len), dense),
                        "positions": (rng.integers(-2 ** 63, 2 ** 63 - 1, n * seq_len, dtype=np.int64), dense),
                        "piece_doc_ids": (rng.integers(-2 ** 63, 2 ** 63 - 1, int(splits[-1]), dtype=np.int64),
                                          splits)}, n))
    fast = [frame_examples(columns, n) for columns, n in blocks]
    c_module = example_codec._fast
    monkeypatch.setattr(example_codec, "_fast", None)
    slow = [frame_examples(columns, n) for columns, n in blocks]
    assert fast == slow and fast[0] == b"" and len(fast[-1]) > 40 * 2048
    for data in [bytes(rng.integers(0, 256, size, dtype=np.uint8)) for size in (0, 1, 7, 8, 9, 63, 4099)]:
        want = masked_crc32c(data)  # google-crc32c
        assert c_module.masked_crc32c(data) == want == c_module.masked_crc32c(data, True)
    tf = pytest.importorskip("tensorflow")
    path = tmp_path / "block.tfrecord"
    path.write_bytes(fast[-1])
    columns, n = blocks[-1]
    read = [decode_example(bytes(r.numpy())) for r in tf.data.TFRecordDataset(str(path))]
    assert len(read) == n
    for e, example in enumerate(read):
        for name, (values, splits) in columns.items():
            assert (example[name] == values[splits[e]:splits[e + 1]]).all()


def test_framed_block_refuses_splits_that_do_not_cover_the_values():
    from model_contract import example_codec

    if example_codec._fast is None:
        pytest.skip("model_contract._varint was not built (no compiler)")
    values = np.arange(10)
    for splits, n in ((np.array([0, 4, 9]), 2), (np.array([0, 6, 4, 10]), 3), (np.array([1, 10]), 1),
                      (np.array([0, 10]), 2)):
        with pytest.raises(ValueError, match="splits"):
            example_codec._fast.frame_int64_examples(((b"\x0a\x01x", values, splits),), n)


def test_varint_shortcuts_in_c_give_the_numpy_paths_bytes_at_every_width(monkeypatch):
    """_varint.c writes a column of one-byte values as a narrowing copy and a value below 2^28 as one 4-byte word
    (branch-free, while at least 3 values follow), with a branch-free varint size: values on both sides of every
    7-bit boundary, columns of every length 0..9 (the word store's tail), one-byte columns, and columns that
    mix all of them must give the numpy path's bytes, in a framed block and in a lone example."""
    from model_contract import example_codec, frame_examples

    if example_codec._fast is None:
        pytest.skip("model_contract._varint was not built (no compiler): only the numpy path exists here")
    edges = [0, 1]
    for bits in range(7, 63, 7):
        edges += [(1 << bits) - 1, 1 << bits, (1 << bits) + 1]
    edges += [2 ** 63 - 1, -1, -2 ** 63, -(1 << 28)]
    edges = np.array(edges, dtype=np.int64)
    rng = np.random.default_rng(17)
    columns_list = []
    for n in (1, 5, 40):
        counts = {"a_edges": rng.integers(0, 10, n), "b_one_byte": rng.integers(0, 10, n),
                  "c_small": rng.integers(0, 10, n)}
        columns = {}
        for name, count in counts.items():
            splits = np.concatenate(([0], np.cumsum(count)))
            size = int(splits[-1])
            if name == "a_edges":
                values = rng.choice(edges, size)
            elif name == "b_one_byte":
                values = rng.integers(0, 128, size)
            else:
                values = rng.integers(0, 1 << 28, size) >> rng.integers(0, 28, size)  # 1 to 4 bytes
            columns[name] = (values.astype(np.int64), splits)
        columns_list.append((columns, n))
    singles = [{"x": edges[i:i + k]} for k in range(0, 10) for i in range(0, edges.size - k, 5)]
    singles.append({"x": edges})
    fast_blocks = [frame_examples(columns, n) for columns, n in columns_list]
    fast_singles = [example_codec.encode_example(f) for f in singles]
    monkeypatch.setattr(example_codec, "_fast", None)
    assert fast_blocks == [frame_examples(columns, n) for columns, n in columns_list]
    assert fast_singles == [example_codec.encode_example(f) for f in singles]
