"""transforms/shard/corpus_stats.py: the byte-fallback count by id range equals the count through the mask."""
from __future__ import annotations

import numpy as np
import pytest

from transforms.shard import corpus_stats


def _mask(vocab: int, byte_ids) -> np.ndarray:
    mask = np.zeros(vocab, dtype=bool)
    mask[list(byte_ids)] = True
    return mask


def test_byte_pieces_in_one_run_give_a_range_and_scattered_ones_do_not():
    assert corpus_stats.byte_id_range(_mask(32000, range(3, 259))) == (3, 256)
    assert corpus_stats.byte_id_range(_mask(32000, [3, 4, 9])) is None
    assert corpus_stats.byte_id_range(_mask(100, [])) is None


@pytest.mark.parametrize("dtype", [np.int16, np.int32, np.int64, np.uint16, np.uint32])
def test_the_range_count_is_the_mask_count_for_every_id_dtype(dtype):
    mask = _mask(32000, range(3, 259))
    byte_range = corpus_stats.byte_id_range(mask)
    edges = np.array([0, 2, 3, 4, 258, 259, 260, 31999], dtype=dtype)  # both sides of both ends of the run
    rng = np.random.default_rng(0)
    ids = np.concatenate([edges, rng.integers(0, 32000, 5000).astype(dtype)])
    assert corpus_stats.byte_fallback_count(ids, mask, byte_range) == int(mask[ids].sum())
    assert corpus_stats.byte_fallback_count(edges, mask, byte_range) == 3  # 3, 4 and 258


def test_stats_count_byte_tokens_with_and_without_the_range():
    mask = _mask(1000, range(10, 20))
    ids = np.array([9, 10, 15, 19, 20, 500], dtype=np.int32)
    with_range, without = {}, {}
    corpus_stats.add_tokenized(with_range, "web", "héllo", ids, mask, corpus_stats.byte_id_range(mask))
    corpus_stats.add_tokenized(without, "web", "héllo", ids, mask)
    assert with_range == without
    assert with_range["web"]["byte_fallback_tokens"] == 3 and with_range["web"]["bytes"] == 6


@pytest.mark.parametrize("text", ["abc", "\x00\x7f", "é", "\x85", "日本語", "🤖", "a\u2003b"])
def test_bytes_are_the_texts_utf8_length_ascii_or_not(text):
    """review30 (held): an ASCII text's bytes are counted by len, any other by its UTF-8 encoding."""
    stats = {}
    corpus_stats.add_tokenized(stats, "s", text, np.array([], dtype=np.int32), _mask(10, []))
    assert stats["s"]["bytes"] == len(text.encode("utf-8")) and stats["s"]["chars"] == len(text)
