"""model_contract/manifest.py: names read back from a manifest (paths, generations) stay inside the dataset, and
every section round-trips byte for byte through the typed records."""
from __future__ import annotations

import json
import re

import pytest

from model_contract import ContractError
from model_contract.manifest import Manifest
from model_contract.manifest_rows import BandIndexRow, FileDigest, IdIndexRow, LedgerRow
from model_contract.retrieval import AlignedShard, SidecarInfo
from tests.manifest_fixtures import GEN_A, make_shard, valid_manifest_dict


@pytest.mark.parametrize("entry,damage", [
    ("generations[0].name", lambda d: d["generations"][0].update(name="/tmp/victim")),
    ("generations[0].name", lambda d: d["generations"][0].update(name="../..")),
    ("generation", lambda d: d.update(generation="gen-0123456789abcdef/../../x")),
    ("shards[0].path", lambda d: d["shards"][0].update(path="/etc/passwd")),
    ("shards[0].path", lambda d: d["shards"][0].update(path=f"{GEN_A}/../../x.tfrecord")),
    ("dead_letters[0]", lambda d: d.update(dead_letters=["../outside.jsonl"])),
    ("ledger[0].generation", lambda d: d["ledger"][0].update(generation="..")),
    ("ledger[0].bytes", lambda d: d["ledger"][0].update(bytes="many")),
    ("generations[0].tokens", lambda d: d["generations"][0].update(tokens=-1)),
])
def test_a_damaged_manifest_is_refused_naming_the_entry(entry, damage):
    d = valid_manifest_dict()
    assert Manifest.from_json(json.dumps(d)).generation == GEN_A
    damage(d)
    with pytest.raises(ContractError, match=re.escape(entry)):
        Manifest.from_json(json.dumps(d))


SHA = "ab" * 32


def _every_section() -> dict:
    """A manifest with every section the shard job and the neighbours job write, and one this reader does not
    know, written out as JSON by hand (not by the library under test)."""
    d = valid_manifest_dict()
    gen = GEN_A
    d["ledger"] = [{"path": "in/a.jsonl", "bytes": 3, "generation": gen, "mtime": 1.5, "etag": "e1", "sha256": SHA},
                   {"path": "in/b.jsonl", "bytes": None, "generation": gen}]
    d["skipped_inputs"] = [{"path": "in/dir", "reason": "not a regular file"}]
    d.update({
        "kind": "dataset",
        "dead_letter_files": [{"path": f"{gen}/dead_letter/f000000-read.jsonl", "bytes": 7, "sha256": SHA}],
        "doc_id_indexes": [{"generation": gen, "path": f"{gen}/doc-ids.idx", "documents": 4, "bytes": 32,
                            "sha256": SHA}],
        "duplicates_by_source": {"Pile-CC": 2, "StdlibCode": 0},
        "near_dedup_band_indexes": [{"generation": gen, "range": r, "path": f"{gen}/near-dedup/band-index-r0{r}.bin",
                                     "bytes": 10 * r, "sha256": SHA} for r in range(2)],
        "retrieval": {"fingerprint": "f" * 16, "dataset_generation": gen,
                      "aligned": [{"shard": f"{gen}/train-00000-of-00001.tfrecord", "examples": 1,
                                   "sidecar": f"{gen}/neighbours-00000.tfrecord"}],
                      "db": {"fingerprint": "d" * 16, "generation": gen, "encoder": {"name": "bm25"},
                             "index": {"kind": "bm25"}},
                      "counts": {"chunks": 4, "padding_chunks": 0, "neighbours": 8, "missing": 0},
                      "storage": {"sidecar_bytes": 10, "shard_bytes": 20, "ratio_to_shards": 0.5,
                                  "token_dtype": "uint16"}},
        "statistics": {"length_bins": "log2", "sources": {"Pile-CC": {"documents": 2}}},
        "mixture": {"weights": {"Pile-CC": 1.0}},
        "near_dedup": {"removed": {"near_duplicate": 1}, "band_index": []},
        "tokenizer_backend": {"name": "sentencepiece", "reason": "default"},
        "later_section": {"k": [1, 2.5, None, "x"]},
    })
    return d


def test_every_section_round_trips_byte_identically_through_the_typed_records():
    text = json.dumps(_every_section(), sort_keys=True, indent=1, ensure_ascii=False) + "\n"  # the canonical form
    m = Manifest.from_json(text)
    assert m.to_json() == text
    assert all(isinstance(r, LedgerRow) for r in m.ledger) and m.ledger[1].bytes is None
    assert [type(r) for r in m.dead_letter_files] == [FileDigest]
    assert [type(r) for r in m.doc_id_indexes] == [IdIndexRow]
    assert [(type(r), r.range) for r in m.band_indexes] == [(BandIndexRow, 0), (BandIndexRow, 1)]
    assert isinstance(m.retrieval, SidecarInfo) and [type(a) for a in m.retrieval.aligned] == [AlignedShard]
    assert m.kind == "dataset" and m.duplicates_by_source == {"Pile-CC": 2, "StdlibCode": 0}
    # the open sections and the unknown one stay JSON values, and nothing known is left in `extra`
    assert sorted(m.extra) == ["later_section", "mixture", "near_dedup", "statistics", "tokenizer_backend"]
    assert Manifest.from_json(m.to_json()).to_json() == text


def test_absent_sections_stay_absent():
    d = valid_manifest_dict()
    text = json.dumps(d, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
    m = Manifest.from_json(text)
    assert m.to_json() == text
    assert (m.kind, m.dead_letter_files, m.doc_id_indexes, m.band_indexes, m.retrieval) == (None,) * 5
