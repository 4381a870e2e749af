"""pipeline/shard/integrity.py `merge`: the dataset after a second generation holds the sum of both."""
from __future__ import annotations

from model_contract.manifest_rows import BandIndexRow, FileDigest, IdIndexRow
from pipeline.shard import integrity
from tests.manifest_fixtures import GEN_A, GEN_B, make_manifest, make_shard

SHA = "ab" * 32


def test_totals_after_two_generations_equal_the_sum_of_both():
    rec_a = {"read": 10, "written": 7, "filtered": {"empty": 2}, "dead_lettered": {"invalid_json": 1}}
    rec_b = {"read": 5, "written": 4, "filtered": {"empty": 1}, "dead_lettered": {}}
    a = make_manifest(GEN_A, [make_shard(GEN_A)], rec_a, inputs=[{"path": "a", "read": 10}])
    a.splits = {"train": {"documents": 7, "tokens": 70, "examples": 3, "shards": 1, "padding_tokens": 2}}
    a.sources = {"s": {"train": {"documents": 7, "tokens": 70}}}
    b = make_manifest(GEN_B, [make_shard(GEN_B)], rec_b, inputs=[{"path": "b", "read": 5}])
    b.splits = {"train": {"documents": 4, "tokens": 40, "examples": 2, "shards": 1, "padding_tokens": 1}}
    b.sources = {"s": {"train": {"documents": 4, "tokens": 40}}}
    merged = integrity.merge(a, b)
    assert merged.records == {"read": 15, "written": 11, "filtered": {"empty": 3},
                              "dead_lettered": {"invalid_json": 1}}
    assert merged.splits["train"] == {"documents": 11, "tokens": 110, "examples": 5, "shards": 2,
                                      "padding_tokens": 3}
    assert merged.sources == {"s": {"train": {"documents": 11, "tokens": 110}}}
    assert [g["name"] for g in merged.generations] == [GEN_A, GEN_B] and merged.generation == GEN_B
    assert [s.path for s in merged.shards] == [s.path for s in a.shards + b.shards]


def test_the_integrity_sections_of_two_generations_are_concatenated_as_records():
    a, b = make_manifest(GEN_A, [make_shard(GEN_A)]), make_manifest(GEN_B, [make_shard(GEN_B)])
    a.dead_letter_files = [FileDigest(f"{GEN_A}/dead_letter/z.jsonl", 1, SHA)]
    b.dead_letter_files = [FileDigest(f"{GEN_B}/dead_letter/a.jsonl", 2, SHA)]
    a.doc_id_indexes = [IdIndexRow(GEN_A, f"{GEN_A}/doc-ids.idx", 1, 8, SHA)]
    b.doc_id_indexes = [IdIndexRow(GEN_B, f"{GEN_B}/doc-ids.idx", 2, 16, SHA)]
    a.duplicates_by_source, b.duplicates_by_source = {"s": 1}, {"s": 2, "r": 1}
    b.band_indexes = [BandIndexRow(GEN_B, 0, f"{GEN_B}/near-dedup/band-index-r00.bin", 4, SHA)]
    merged = integrity.merge(a, b)
    assert [r.path for r in merged.dead_letter_files] == [f"{GEN_A}/dead_letter/z.jsonl",
                                                          f"{GEN_B}/dead_letter/a.jsonl"]
    assert [r.generation for r in merged.doc_id_indexes] == [GEN_A, GEN_B]
    assert merged.duplicates_by_source == {"r": 1, "s": 3} and merged.band_indexes == b.band_indexes
    assert integrity.merge(a, a).band_indexes is None  # no generation has one: the section stays absent
