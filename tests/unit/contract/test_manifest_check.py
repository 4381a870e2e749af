"""model_contract/schema.py + model_contract/manifest_check.py: every field of a manifest is checked on load.

A hand-edited or damaged manifest fails in `load_manifest` with one ContractError naming the field path, and
`pileprep verify / inspect / report` turn it into exit 2 with one line on stderr (pipeline/errors.py), instead
of a KeyError / TypeError traceback or, worse, exit 0 with a negative count.
"""
from __future__ import annotations

import copy
import json
import logging
import re

import pytest

from model_contract import ContractError, DataContract, Manifest, ShardInfo, TokenizerInfo, load_manifest
from model_contract.manifest_rows import FileDigest, GenerationRow, IdIndexRow, LedgerRow, RecordCounts
from model_contract.retrieval import DbManifest, DbShard, SidecarInfo, check_db_manifest
from model_contract.schema import SchemaError
from pipeline import cli
from pipeline.ops.commit import to_canonical_json as canonical_json

GEN = "gen-" + "a" * 16
SHA = "cd" * 32


def _valid() -> dict:
    """A manifest with every section the shard job writes, built by the library (so it is canonical)."""
    tok = TokenizerInfo("sentencepiece", "ab" * 32, 1000, 2, 3, 0, 1)
    shards = [ShardInfo(f"{GEN}/{split}-00000-of-00001.tfrecord", split, 3, 20, 4, 2, 100, SHA)
              for split in ("train", "val")]
    counts = {"read": 5, "written": 4, "filtered": {"duplicate": 1}, "dead_lettered": {}}
    m = Manifest(
        contract=DataContract.for_tokens(8, tok), shards=shards,
        splits={s: {"documents": 2, "tokens": 20, "padding_tokens": 4, "examples": 3, "shards": 1}
                for s in ("train", "val")},
        sources={"Pile-CC": {"train": {"documents": 2, "tokens": 20}}}, padding_fraction=0.1, records=counts,
        inputs=[{"path": "in/a.jsonl", "bytes": 50, **counts}], dead_letters=[f"{GEN}/dead_letter/a.jsonl"],
        config={"seq_len": 8}, pileprep_version="0.1.0", generation=GEN,
        generations=[{"name": GEN, "inputs": 1, "shards": 2, "examples": 6, "tokens": 40, "documents": 4}],
        ledger=[LedgerRow("in/a.jsonl", 50, GEN, mtime=1.5, sha256=SHA)],
        skipped_inputs=[{"path": "in/dir", "reason": "not a regular file"}],
        dead_letter_files=[FileDigest(f"{GEN}/dead_letter/a.jsonl", 7, SHA)],
        doc_id_indexes=[IdIndexRow(GEN, f"{GEN}/doc-ids.idx", 4, 32, SHA)],
        duplicates_by_source={"Pile-CC": 1}, extra={"statistics": {"length_bins": "log2"}})
    return json.loads(m.to_json())


def _set(path: str, value):
    """A damage: set the field at a dotted path (`shards.3.sha256`) to `value`."""
    def damage(d):
        *head, last = path.split(".")
        for key in head:
            d = d[int(key)] if isinstance(d, list) else d[key]
        d[int(last) if isinstance(d, list) else last] = value
    return damage


def _drop(key: str):
    return lambda d: d.pop(key)


# (damage, the field path the one-line error must name); the issue's cases first.
CASES = [
    (_drop("contract"), "contract"),
    (_set("shards.1.sha256", 12), "shards[1].sha256"),
    (_set("records", []), "records"),
    (_set("sources", [1]), "sources"),
    (_set("shards.0.examples", -5), "shards[0].examples"),
    (_set("contract.seq_len", "512"), "contract.seq_len"),
    (_set("contract.tokenizer.vocab_size", True), "contract.tokenizer.vocab_size"),
    (_set("contract.tokenizer.model_sha256", "<script>"), "contract.tokenizer.model_sha256"),
    (_set("contract.features.0.shape", ["8"]), "contract.features[0].shape"),
    (_drop("shards"), "shards"),
    (_set("shards.0.bytes", 1.5), "shards[0].bytes"),
    (_set("shards.0.split", None), "shards[0].split"),
    (_set("splits.train.tokens", "20"), "splits.train.tokens"),
    (_set("sources.Pile-CC.train.documents", -1), "sources.Pile-CC.train.documents"),
    (_set("padding_fraction", 2.0), "padding_fraction"),
    (_set("records.read", None), "records.read"),
    (_set("records.filtered.duplicate", "1"), "records.filtered.duplicate"),
    (_set("inputs.0.written", -1), "inputs[0].written"),
    (_set("inputs.0.path", 3), "inputs[0].path"),
    (_set("config", "x"), "config"),
    (_set("ledger.0.sha256", "abc"), "ledger[0].sha256"),
    (_set("ledger.0.mtime", "yesterday"), "ledger[0].mtime"),
    (_set("skipped_inputs.0.reason", 1), "skipped_inputs[0].reason"),
    (_set("dead_letter_files.0.sha256", 0), "dead_letter_files[0].sha256"),
    (_set("dead_letter_files.0.path", "/etc/passwd"), "dead_letter_files[0].path"),
    (_set("doc_id_indexes.0.documents", -2), "doc_id_indexes[0].documents"),
    (_set("doc_id_indexes.0.generation", "../x"), "doc_id_indexes[0].generation"),
    (_set("duplicates_by_source.Pile-CC", "many"), "duplicates_by_source.Pile-CC"),
    (_set("statistics", []), "statistics"),
]
IDS = [path for _damage, path in CASES]


def test_the_valid_manifest_loads_and_writes_back_unchanged(tmp_path):
    d = _valid()
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    assert json.loads(load_manifest(str(tmp_path)).to_json()) == d


@pytest.mark.parametrize("damage,field", CASES, ids=IDS)
def test_load_manifest_refuses_a_damaged_field_naming_it(tmp_path, damage, field):
    d = _valid()
    damage(d)
    (tmp_path / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ContractError, match=rf"manifest {re.escape(field)}\b") as err:
        load_manifest(str(tmp_path))
    assert "\n" not in str(err.value)


def test_an_in_memory_manifest_is_checked_before_a_commit_uses_it():
    m = Manifest.from_dict(_valid())
    m.shards[0] = ShardInfo(m.shards[0].path, "train", -1, 0, 0, 0, 0, SHA)
    with pytest.raises(SchemaError, match=r"shards\[0\]\.examples"):
        m.validate()


def test_records_round_trip_their_json():
    d = _valid()
    assert RecordCounts.from_dict(d["records"]).to_dict() == d["records"]
    assert LedgerRow.from_dict(d["ledger"][0]).to_dict() == d["ledger"][0]
    assert GenerationRow.from_dict(d["generations"][0]).to_dict() == d["generations"][0]
    side = {"fingerprint": "f" * 16, "dataset_generation": GEN, "db": {"generation": GEN},
            "aligned": [{"shard": d["shards"][0]["path"], "examples": 3, "sidecar": f"{GEN}/n-0.tfrecord"}],
            "counts": {"chunks": 4}, "storage": {"sidecar_bytes": 9, "ratio_to_shards": 0.5}}
    assert SidecarInfo.from_dict(side).to_dict() == side


def test_the_sidecar_and_database_manifests_are_checked_too():
    side = dict(_valid(), retrieval={"fingerprint": "f", "dataset_generation": GEN,
                                     "aligned": [{"shard": "../x", "examples": 3, "sidecar": "s"}]})
    with pytest.raises(ContractError, match=r"retrieval\.aligned\[0\]\.shard"):
        Manifest.from_dict(side)
    db = {"format": "pileprep.retrieval_db", "generation": GEN, "fingerprint": "f", "chunk_len": 64,
          "index": {"kind": "bm25", "files": {"idf": {"path": f"{GEN}/index/idf.npy", "bytes": 1, "sha256": SHA}}},
          "shards": [{"path": f"{GEN}/chunks-0.parquet", "chunks": 2, "documents": 1, "tokens": 9, "bytes": 5,
                      "sha256": SHA, "first_id": 0}], "counts": {"chunks": 2}, "sources": {"s": {"chunks": 2}}}
    assert check_db_manifest(copy.deepcopy(db)) == db
    for damage, field in [(_set("shards.0.first_id", -1), "shards[0].first_id"),
                          (_set("chunk_len", 0), "chunk_len"),
                          (_set("index.files.idf.path", "/abs"), "index.files.idf.path"),
                          (_set("sources.s.chunks", "2"), "sources.s.chunks")]:
        bad = copy.deepcopy(db)
        damage(bad)
        with pytest.raises(ContractError, match=re.escape(field)):
            check_db_manifest(bad)
        with pytest.raises(ContractError, match=re.escape(field)):
            DbManifest.from_dict(bad)


def test_the_database_manifest_round_trips_byte_identically_through_its_record():
    part = {"path": f"{GEN}/index/part-0.bin", "bytes": 3, "sha256": SHA, "vectors": 2}
    db = {"format": "pileprep.retrieval_db", "kind": "retrieval-db", "pileprep_version": "0.1.0", "generation": GEN,
          "fingerprint": "f", "chunk_len": 64, "dataset": {"generation": GEN, "seq_len": 128, "shards": []},
          "tokenizer": {"kind": "sentencepiece"}, "config": {"chunk_len": 64}, "encoder": {"name": "minilm"},
          "index": {"kind": "faiss", "config": {"nprobe": 4},
                    "trained": {"path": f"{GEN}/index/trained.bin", "bytes": 1, "sha256": SHA}},
          "shards": [{"path": f"{GEN}/chunks-0.parquet", "chunks": 2, "documents": 1, "tokens": 9, "bytes": 5,
                      "sha256": SHA, "first_id": 0, "index_part": part,
                      "embeddings": {"path": f"{GEN}/emb-0.npy", "bytes": 4, "sha256": SHA, "rows": 2}},
                     {"path": f"{GEN}/chunks-1.parquet", "chunks": 1, "documents": 1, "tokens": 3, "bytes": 5,
                      "sha256": SHA, "first_id": 2}],
          "counts": {"chunks": 3}, "sources": {"s": {"chunks": 3}}, "later_section": [1]}
    m = DbManifest.from_dict(copy.deepcopy(db))
    assert canonical_json(m.to_dict()) == canonical_json(db)
    assert [type(s) for s in m.shards] == [DbShard, DbShard] and m.shards[1].index_part is None
    assert (m.generation, m.chunk_len, m.encoder["name"], m.extra) == (GEN, 64, "minilm", {"later_section": [1]})


def test_a_rerun_of_retrieval_neighbours_reads_the_committed_sidecar_checked(tmp_path):
    """pipeline/retrieval/store.py `read_manifest`, which the sidecar job's rerun plans from, checked only the
    database's fields: a hand-edited sidecar manifest was silently planned from and replaced (exit 0)."""
    from model_contract.manifest_check import MANIFEST_FORMAT
    from pipeline.retrieval import store

    (tmp_path / "manifest.json").write_text(json.dumps(_valid()))
    assert store.read_manifest(str(tmp_path), MANIFEST_FORMAT) == _valid()
    for damage, field in CLI_CASES:
        d = _valid()
        damage(d)
        (tmp_path / "manifest.json").write_text(json.dumps(d))
        with pytest.raises(ContractError, match=re.escape(f"manifest {field}:")):
            store.read_manifest(str(tmp_path), MANIFEST_FORMAT)


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:], root.level = handlers, level


# The issue's cases through the commands that crashed on them or passed them with exit 0.
CLI_CASES = [case for case in CASES if case[1] in ("contract", "shards[1].sha256", "records", "sources",
                                                   "shards[0].examples", "contract.seq_len")]


@pytest.mark.parametrize("command", ["verify", "inspect", "report"])
def test_the_cli_refuses_a_damaged_manifest_in_one_line_exit_2(tmp_path, capsys, restore_logging, command):
    for damage, field in CLI_CASES:
        d = _valid()
        damage(d)
        dataset = tmp_path / field.replace("[", "_").replace("]", "_")
        dataset.mkdir()
        (dataset / "manifest.json").write_text(json.dumps(d))
        args = [command, str(dataset)] + (["--output", str(dataset / "report.html")] if command == "report" else [])
        code = cli.main(args)
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert code == 2, (field, command, out[-500:], err[-2000:])
        assert len(lines) == 1 and lines[0].startswith("pileprep: error:") and f"manifest {field}" in lines[0], \
            (field, command, err)


def test_the_sections_load_as_records():
    m = Manifest.from_dict(_valid())
    assert [(r.generation, r.path, r.documents) for r in m.doc_id_indexes] == [(GEN, f"{GEN}/doc-ids.idx", 4)]
    assert [(r.path, r.bytes) for r in m.dead_letter_files] == [(f"{GEN}/dead_letter/a.jsonl", 7)]
    assert [r.sha256 for r in m.ledger] == [SHA] and [g.examples for g in m.generation_rows()] == [6]
    assert m.retrieval is None and m.band_indexes is None and m.kind is None
