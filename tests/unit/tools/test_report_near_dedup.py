"""The report's near-dedup section (pipeline/tools/report_near_dedup.py): figures from the manifest, text escaped."""
from __future__ import annotations

from pipeline.tools import report, report_near_dedup

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def manifest() -> dict:
    return {
        "sources": {"Pile-CC": {"train": {"documents": 90, "tokens": 1}}, "Github": {"train": {"documents": 50}}},
        "near_dedup": {
            "removed_by_source": {"near_duplicate": {"Pile-CC": 10}, "contaminated": {"Github": 2, HOSTILE: 1}},
            "cluster_sizes": {"2": 8, "3-4": 1},
            "example_pairs": [{"removed": 7, "keeper": 3, "jaccard": 0.91, "source": "Pile-CC",
                               "keeper_source": "Pile-CC", "removed_text": HOSTILE, "keeper_text": "kept text"}],
            "contaminated_examples": [{"id": 9, "source": "Github", "eval_file": "mmlu.jsonl",
                                       "ngram": HOSTILE}],
            "minhash": {"bands": 10, "rows": 10, "threshold": 0.8, "verify": True, "shingle_words": 5,
                        "s_curve": "threshold ~0.79"},
            "sidecars": [{"path": "gen/near-dedup/removed-p000.jsonl"}]}}


def test_section_shows_shares_histogram_and_pairs_with_every_text_escaped():
    page = report_near_dedup.section(manifest())
    assert "<script" not in page and "<img" not in page and "&lt;script&gt;" in page
    assert "10.00%" in page  # Pile-CC: 10 removed of 90 written + 10
    assert "3.85%" in page  # Github: 2 of 50 + 2
    assert "kept text" in page and "0.91" in page and "mmlu.jsonl" in page
    assert "3-4" in page and "verified by exact Jaccard" in page
    assert "over word 5-grams" in page


def test_section_names_token_shingles_when_the_run_used_them():
    m = manifest()
    m["near_dedup"]["minhash"].update(shingles="tokens", shingle_tokens=5)
    page = report_near_dedup.section(m)
    assert "over token 5-grams" in page and "word" not in page.split("MinHash")[1].split("</p>")[0]


def test_section_is_absent_without_near_dedup_and_the_report_includes_it():
    assert report_near_dedup.section({"sources": {}}) == ""
    m = manifest()
    assert report_near_dedup.section(m) in report.render_report({**m, **_minimal()})


def _minimal() -> dict:
    return {"contract": {"seq_len": 8, "version": "1.2", "tokenizer": {"vocab_size": 10, "model_sha256": "0" * 64}},
            "splits": {}, "records": {"read": 0, "written": 0, "filtered": {}, "dead_lettered": {}},
            "shards": [], "padding_fraction": 0.0}
