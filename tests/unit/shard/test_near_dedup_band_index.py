"""Incremental near-dedup's pure parts: committed documents in the band buckets, the band index file, and the
checks on what a committed manifest says about it (transforms/shard/near_dedup/band_index.py,
pipeline/shard/near_dedup/committed.py committed_band_indexes, windows.py committed_range_rows)."""
from __future__ import annotations

import dataclasses
import hashlib
import types

import numpy as np
import pytest

from model_contract.manifest_rows import BandIndexRow
from pipeline.errors import ConfigError, RunError
from pipeline.shard.near_dedup import committed, windows
from pipeline.shard.near_dedup.elements import CommittedBandFile
from transforms.shard.near_dedup import band_index as bi
from transforms.shard.near_dedup import clusters, minhash, shingling

TEXT = " ".join(f"word{i % 97} token{i % 13} item{i}" for i in range(120))
NEAR = "Mirrored from an archive. " + TEXT.upper()
OTHER = " ".join(f"other{i % 31} thing{i}" for i in range(120))
GEN = "gen-00000000000000aa"
PARAMS = minhash.MinHashParams()


def _sig(text):
    return minhash.signatures([shingling.shingles(text)], PARAMS)[0]


def _new(doc_id, text, split=0):
    return clusters.Node(clusters.rank(split, doc_id), doc_id, split, _sig(text).tobytes())


def _committed(doc_id, text, split=0):
    rows = np.zeros(1, bi.row_dtype(PARAMS.num_perm))
    rows[0] = (5, doc_id, split, _sig(text))
    return bi.committed_nodes(rows, GEN)[0][1]


def test_a_committed_document_keeps_a_near_copy_out_even_when_the_copy_would_win_a_full_build():
    committed, copy = _committed(900, TEXT), _new(3, NEAR)  # the new copy has the smaller id
    full = clusters.components(clusters.bucket_edges([_new(900, TEXT), copy], 0.8))[0]
    assert full[900][1].doc_id == 3  # a full build keeps the smaller id
    labels, converged = clusters.components(clusters.bucket_edges([copy, committed], 0.8))
    assert converged and labels[3][1] is committed  # incrementally the committed one wins
    assert clusters.rank(0, 1 << 60, committed=True) < clusters.rank(2, 0)  # over any new split too


def test_committed_documents_are_not_linked_to_each_other_and_new_ones_still_cluster():
    a, b = _committed(10, TEXT), _committed(11, NEAR)  # near each other, but both committed: decided already
    assert clusters.bucket_edges([a, b], 0.8) == []
    n1, n2 = _new(20, OTHER), _new(21, OTHER.upper())
    edges = clusters.bucket_edges([a, b, n1, n2], 0.8)
    assert [(x.doc_id, y.doc_id) for x, y, _j in edges] == [(20, 21)]  # far from both committed ones
    near = _new(30, TEXT + " tail")
    assert [(x.doc_id, y.doc_id) for x, y, _j in clusters.bucket_edges([b, a, near], 0.8)] == [(10, 30)]  # the best


def test_band_index_round_trip_keeps_one_row_per_key_and_id_sorted_and_refuses_damage():
    n1, n2 = _new(7, TEXT, split=1), _new(4, OTHER)
    data = bi.encode([(9, n1), (2, n2), (9, _new(7, TEXT)), (2, n1)], PARAMS.num_perm)
    rows = bi.decode(data, PARAMS.num_perm, "x")
    assert [(int(r["key"]), int(r["doc_id"]), int(r["split"])) for r in rows] == [(2, 4, 0), (2, 7, 1), (9, 7, 1)]
    assert np.array_equal(rows[2]["sig"], n1.signature())
    with pytest.raises(ValueError, match="whole number"):
        bi.decode(data[:-1], PARAMS.num_perm, "x")
    with pytest.raises(ValueError, match="not sorted"):
        bi.decode(rows[::-1].tobytes(), PARAMS.num_perm, "x")
    with pytest.raises(ValueError, match="sha256"):
        bi.checked_bytes(data, len(data), hashlib.sha256(data[1:]).hexdigest(), "x")


def _manifest(rows, generations=(GEN,), config=None):
    return types.SimpleNamespace(band_indexes=[BandIndexRow(**r) for r in rows],
                                 generations=[{"name": g} for g in generations],
                                 generation=generations[-1], config=dict(config or {}))


def _row(**kw):
    return {"generation": GEN, "path": f"{GEN}/near-dedup/band-index-r00.bin", "range": 0, "bytes": 0,
            "sha256": hashlib.sha256(b"").hexdigest(), **kw}


def test_committed_band_index_rows_are_validated_before_use(tmp_path):
    got = committed.committed_band_indexes(_manifest([_row()]), str(tmp_path))
    assert got[0].path == str(tmp_path / GEN / "near-dedup" / "band-index-r00.bin")
    for bad in (_row(path=f"{GEN}/../../etc/passwd"), _row(path="gen-00000000000000bb/x.bin"),
                _row(generation="../x"), _row(range=99), _row(sha256=None)):
        with pytest.raises(ConfigError, match="--incremental --near-dedup"):
            committed.committed_band_indexes(_manifest([bad]), str(tmp_path))
    with pytest.raises(ConfigError, match="gen-00000000000000bb .*no band index"):
        committed.committed_band_indexes(_manifest([_row()], (GEN, "gen-00000000000000bb")), str(tmp_path))


def test_an_incremental_run_with_other_shingles_than_the_committed_band_index_is_refused_by_name(tmp_path):
    """Word and token shingle signatures never agree: a new document signed with the other kind would match no
    committed one, so its near-copies of committed documents would stay. A config without the key is `words`
    (pipeline/config.py drops it at the default, as datasets built before the option have it)."""
    words, tokens = _manifest([_row()]), _manifest([_row()], config={"near_dedup_shingles": "tokens"})
    assert committed.committed_band_indexes(words, str(tmp_path), "words")
    assert committed.committed_band_indexes(tokens, str(tmp_path), "tokens")
    with pytest.raises(ConfigError, match="--near-dedup-shingles tokens differs from the committed dataset's "
                                          r"\(words\)"):
        committed.committed_band_indexes(words, str(tmp_path), "tokens")
    with pytest.raises(ConfigError, match=r"--near-dedup-shingles words differs .*\(tokens\)"):
        committed.committed_band_indexes(tokens, str(tmp_path), "words")


def test_the_shingle_kind_is_in_the_fingerprint_only_when_it_is_not_the_default():
    """Generation names of datasets built before --near-dedup-shingles stay; tokens is another dataset, and
    --incremental refuses it against a words dataset by the config key (pipeline/ops/incremental.py)."""
    from pipeline.config import ShardConfig
    from pipeline.ops import incremental

    base = dict(inputs=("x.jsonl",), output="out", tokenizer="t.model", near_dedup=True)
    words, tokens = ShardConfig(**base).to_manifest_dict(), ShardConfig(**base, near_dedup_shingles="tokens")
    assert "near_dedup_shingles" not in words
    assert tokens.to_manifest_dict()["near_dedup_shingles"] == "tokens"
    committed = types.SimpleNamespace(contract=types.SimpleNamespace(to_dict=dict), config=words)
    with pytest.raises(incremental.IncompatibleGenerationError, match="config.near_dedup_shingles"):
        incremental.check_compatible(committed, {}, tokens.to_manifest_dict())


def test_a_committed_band_index_that_does_not_match_its_manifest_row_fails_the_run(tmp_path):
    rows = np.zeros(1, bi.row_dtype(PARAMS.num_perm))
    rows[0] = ((1 << 62) + 5, 1, 0, _sig(TEXT))  # a key of range 4
    data = rows.tobytes()
    path = tmp_path / "b.bin"
    path.write_bytes(data)
    entry = CommittedBandFile(GEN, "b.bin", 4, len(data), hashlib.sha256(data).hexdigest(), str(path))
    assert [n.doc_id for _k, n in windows.committed_range_rows(entry, PARAMS.num_perm)] == [1]
    with pytest.raises(RunError, match="outside its range"):
        windows.committed_range_rows(dataclasses.replace(entry, range=0), PARAMS.num_perm)
    path.write_bytes(data[:-4] + b"\0\0\0\0")
    with pytest.raises(RunError, match="unusable.*sha256"):
        windows.committed_range_rows(entry, PARAMS.num_perm)


def test_band_index_from_arrays_is_the_same_bytes_as_from_nodes():
    """The shard job encodes its staged band rows as arrays (pipeline/shard/near_dedup/band_index_writer.py
    write_band_index_range): the bytes must equal `encode` of the same rows as Nodes, copies of one id in two
    units and splits included (the highest split is the row kept)."""
    texts = [f"document {i} " + " ".join(f"w{(i * 7 + j) % 50}" for j in range(60)) for i in range(6)]
    sigs = minhash.signatures([shingling.shingles(t) for t in texts], PARAMS)
    keys = minhash.band_keys(sigs, PARAMS) >> np.uint64(1)
    docs = [(100 + i, i % 3, i) for i in range(6)] + [(100, 2, 0), (103, 0, 3)]  # (id, split, text) copies
    nodes, cols, rows_of = [], ([], [], [], []), []
    for n, (doc_id, split, t) in enumerate(docs):
        node = clusters.Node(clusters.rank(split, doc_id), doc_id, split, sigs[t].tobytes(), "s", ("u", n))
        for k in keys[t].tolist():
            nodes.append((k, node))
            rows_of.append(t)
            for col, v in zip(cols, (k, doc_id, split, sigs[t])):
                col.append(v)
    key_col, id_col, split_col = (np.array(cols[0], dtype=np.uint64), np.array(cols[1], dtype=np.uint64),
                                  np.array(cols[2], dtype=np.uint8))
    arrays = bi.encode_arrays(key_col, id_col, split_col, np.array(cols[3]), PARAMS.num_perm)
    assert arrays == bi.encode(nodes, PARAMS.num_perm)
    # the job's form: one signature table row per document, each band row naming its document's row
    assert bi.encode_arrays(key_col, id_col, split_col, sigs, PARAMS.num_perm,
                            np.array(rows_of, dtype=np.int64)) == arrays
