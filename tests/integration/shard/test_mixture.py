"""Source mixture weights (transforms/shard/mixture.py): epochs per source, realised within tolerance, nothing lost."""
from __future__ import annotations

import collections
import json

import pytest

from model_contract import decode_example, read_records
from pipeline.config import ShardConfig
from pipeline.errors import ConfigError
from pipeline.shard import shard_pipeline
from tests.conftest import stdlib_texts
from tests.corpus_fixtures import pile_line, write_zst
from transforms.shard import mixture

IN_MEMORY = ["--runner=FnApiRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
SEQ_LEN = 128


def test_parse_weights_presets_overrides_and_errors():
    w = mixture.parse_weights("pile,Github=0.5, Wikipedia (en)=4")
    assert w["Github"] == 0.5 and w["Wikipedia (en)"] == 4.0 and w["Gutenberg (PG-19)"] == 2.5
    assert mixture.parse_weights("Pile-CC=1,A=3") == {"A": 3.0, "Pile-CC": 1.0}
    for bad in ("nosuchpreset", "A=x", "A=-1", "=2", "A=inf"):
        with pytest.raises(ValueError):
            mixture.parse_weights(bad)
    with pytest.raises(ConfigError, match="--source-weights"):
        ShardConfig(inputs=("x",), output="o", tokenizer="t", source_weights="A=lots").validate()


def test_copies_follow_the_weight_and_the_seed():
    ids = range(1, 20001)
    for weight in (0.0, 0.3, 1.0, 1.5, 2.25, 3.0):
        mean = sum(mixture.copies(i, weight, seed=7) for i in ids) / len(ids)
        assert abs(mean - weight) < 0.02, (weight, mean)
        assert all(int(weight) <= mixture.copies(i, weight, 7) <= int(weight) + 1 for i in range(1, 200))
    kept0 = {i for i in ids if mixture.copies(i, 0.5, seed=0)}
    kept1 = {i for i in ids if mixture.copies(i, 0.5, seed=1)}
    assert kept0 != kept1 and abs(len(kept0) - len(kept1)) < 500


def test_copies_of_a_document_are_spread_inside_the_key_range():
    lo, hi = 1000, 1 << 40
    docs = [(lo + i * 10_000, 100 + i, "S", i) for i in range(50)]
    placed = list(mixture.arrange(iter(docs), {"S": 3.0}, seed=0, lo=lo, hi=hi))
    assert len(placed) == 150
    assert collections.Counter(d for d, _s, _p, _r in placed) == {100 + i: 3 for i in range(50)}
    side_by_side = sum(1 for a, b in zip(placed, placed[1:]) if a[0] == b[0])
    assert side_by_side <= 3  # independent spots: adjacency is chance, not the rule
    dropped = []
    placed = list(mixture.arrange(iter(docs), {"S": 0.0}, 0, lo, hi, lambda s, p: dropped.append(p)))
    assert placed == [] and dropped == list(range(50))


def _many_source_corpus(root, n_sources=12):
    """Documents of varied size from stdlib text, dealt to many sources; returns the source names."""
    names = [f"Src{i:02d}" for i in range(n_sources)]
    lines = []
    for i, (_name, text) in enumerate(stdlib_texts(2_500_000)):
        for j in range(0, len(text), 400):
            chunk = text[j:j + 400]
            if chunk.strip():
                lines.append(pile_line(chunk, names[(i + j // 400) % n_sources]))
    root.mkdir(parents=True, exist_ok=True)
    write_zst(root / "a.jsonl.zst", lines[0::2])
    write_zst(root / "b.jsonl.zst", lines[1::2] + lines[:40])  # 40 exact duplicates: dedup comes first
    return names


def test_realised_token_shares_match_the_weights(tiny_tokenizer, tmp_path):
    names = _many_source_corpus(tmp_path / "in")
    weights = {names[0]: 3.0, names[1]: 0.4, names[2]: 1.5, names[3]: 2.0, names[4]: 0.0, names[5]: 2.7}
    spec = ",".join(f"{k}={v}" for k, v in weights.items())
    config = ShardConfig(inputs=(str(tmp_path / "in" / "*"),), output=str(tmp_path / "out"),
                         tokenizer=tiny_tokenizer, seq_len=SEQ_LEN, num_shards=2, val_fraction=0.05,
                         test_fraction=0.05, source_weights=spec)
    manifest = shard_pipeline.run(config, IN_MEMORY, progress_every_s=0)
    mix = manifest["mixture"]
    assert mix["weights"] == mixture.parse_weights(spec)
    train_tokens = sum(per["train"]["tokens"] for per in manifest["sources"].values() if "train" in per)
    largest_doc_share = max(2 ** (len(s["length_hist_log2"])) for s in
                            manifest["statistics"]["sources"].values()) / train_tokens
    tolerance = max(0.005, largest_doc_share)
    for source, row in mix["sources"].items():
        assert abs(row["share"] - row["target_share"]) <= tolerance, (source, row, tolerance)
        assert row["tokens"] == manifest["sources"].get(source, {}).get("train", {}).get("tokens", 0)
    assert mix["sources"][names[4]]["tokens"] == 0 and mix["sources"][names[0]]["tokens"] > 0
    assert mix["sources"][names[0]]["share"] > 2 * mix["sources"][names[6]]["share"]
    # nothing lost: dropped documents are filtered with a reason and every file reconciles
    rec = manifest["records"]
    assert rec["filtered"][mixture.DROPPED_REASON] > 0 and rec["filtered"]["duplicate"] >= 40
    assert rec["read"] == rec["written"] + sum(rec["filtered"].values()) + sum(rec["dead_lettered"].values())
    # copies keep id and split, val/test are not weighted, and copies are never packed side by side
    seen = collections.Counter()
    for shard in manifest["shards"]:
        previous = None
        for record in read_records(str(tmp_path / "out" / shard["path"])):
            ex = decode_example(record)
            starts = [int(d) for d, o in zip(ex["piece_doc_ids"], ex["piece_offsets"]) if o == 0]
            for d in starts:
                assert d != previous, "two copies of a document side by side"
                previous = d
                seen[(shard["split"], d)] += 1
    assert max(n for (split, _d), n in seen.items() if split == "train") == 3
    assert all(n == 1 for (split, _d), n in seen.items() if split != "train")
    assert json.loads(json.dumps(manifest)) == manifest


def test_neighbouring_copies_are_moved_apart():
    for order in ([5, 5, 6, 7], [5, 5, 6, 7, 5], [5, 5, 5, 6, 7, 8], [1, 2, 2, 3]):
        placed = [(k, d, 0, "S", None) for k, d in enumerate(order)]
        mixture._separate_copies(placed)  # noqa: SLF001
        docs = [p[1] for p in placed]
        assert sorted(docs) == sorted(order) and all(a != b for a, b in zip(docs, docs[1:])), (order, docs)


def test_train_shards_are_sized_for_the_weighted_tokens():
    from pipeline.shard.manifest_builder import shard_write_tasks
    from transforms.shard.records import UnitResult

    unit = UnitResult("u", 0, "f", "i", "t", 10, "<u2", ["A", "B"], [3_000_000, 0, 0], {}, None,
                      {"A": {"tokens": 1_000_000}, "B": {"tokens": 2_000_000}})
    base = dict(inputs=("x",), output="o", tokenizer="t", target_shard_mb=1.0)
    plain = [t for t in shard_write_tasks([unit], ShardConfig(**base)) if t.split == 0]
    weighted = [t for t in shard_write_tasks([unit], ShardConfig(**base, source_weights="A=4,B=0.5")) if t.split == 0]
    assert mixture.weighted_factor(unit.source_stats, {"A": 4.0, "B": 0.5}) == pytest.approx(5 / 3)
    assert len(weighted) == pytest.approx(len(plain) * 5 / 3, rel=0.05)
