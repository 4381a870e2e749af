"""The shard job writes a long document in exact pieces and dead-letters a token-less stretch over
--max-pretoken-mb (the pieces themselves: tests/unit/tokenize/test_long_documents.py)."""
from __future__ import annotations

from transforms.tokenize import long_documents as ld


def test_the_job_writes_long_documents_and_dead_letters_a_stretch_over_max_pretoken_mb(tmp_path, tiny_tokenizer):
    from pipeline.config import ShardConfig
    from pipeline.shard import shard_pipeline
    from tests.corpus_fixtures import pile_line
    from tests.ops_fixtures import FAST_LOCAL

    inputs = tmp_path / "in"
    inputs.mkdir()
    token_less = "q" * 20_000 + " tail"  # 20 KB without a piece boundary, over --max-pretoken-mb 0.01
    (inputs / "a.jsonl").write_bytes(pile_line(token_less, "S") + pile_line("word " * 6_000, "S")
                                     + pile_line("short", "S"))
    cfg = ShardConfig(inputs=(str(inputs / "*"),), output=str(tmp_path / "out"), tokenizer=tiny_tokenizer,
                      seq_len=128, num_shards=1, val_fraction=0.0, test_fraction=0.0, max_pretoken_mb=0.01)
    manifest = shard_pipeline.run(cfg, FAST_LOCAL, progress_every_s=0)
    # the 30 KB document is written in exact pieces of ~10 KB; the token-less stretch is dead-lettered
    assert manifest["records"]["written"] == 2
    assert manifest["records"]["dead_lettered"] == {ld.PRETOKEN_TOO_LONG: 1}
