"""A worker loads the tokenizer once per thread (transforms/tokenize/worker_cache.py): TokenizeChunk.setup()
run again, as DaskRunner does for every partition, reuses what the first setup loaded, and tokenizes the same."""
from __future__ import annotations

import threading

import numpy as np

from pipeline.config import ShardConfig
from pipeline.shard import plan as shard_plan
from pipeline.shard.stage_dofn import TokenizeChunk
from tests.corpus_fixtures import write_good_corpus
from transforms.tokenize import tokenizer, worker_cache
from transforms.tokenize.formats import TokenizerOptions


def test_a_second_load_in_the_same_thread_is_a_cache_hit_and_other_keys_load(tiny_tokenizer):
    model = open(tiny_tokenizer, "rb").read()
    load = lambda: tokenizer.load_processor(model, tiny_tokenizer)  # noqa: E731
    before = worker_cache.loads()
    first = worker_cache.cached(model, ("a", TokenizerOptions()), load)
    assert worker_cache.cached(model, ("a", TokenizerOptions()), load) is first
    assert worker_cache.loads() == before + 1
    other = worker_cache.cached(model, ("a", TokenizerOptions(eos_token="</s>")), load)  # another option: a load
    assert other is not first and worker_cache.loads() == before + 2
    assert worker_cache.cached(model + b"\0", ("a", TokenizerOptions()), lambda: "x") == "x"  # another model
    assert worker_cache.loads() == before + 3
    # At most MAX_PER_THREAD entries: the least recently used one (`first`) went when the third arrived.
    again = worker_cache.cached(model, ("a", TokenizerOptions()), load)
    assert again is not first and worker_cache.loads() == before + 4

    seen = []
    thread = threading.Thread(target=lambda: seen.append(worker_cache.cached(model, ("a", TokenizerOptions()), load)))
    thread.start()
    thread.join()
    assert seen[0] is not again  # another thread never shares this thread's encoder
    assert worker_cache.loads() == before + 5


def test_tokenize_setup_again_does_not_reload_and_encodes_the_same(tmp_path, tiny_tokenizer):
    write_good_corpus(tmp_path / "in", limit_bytes=40_000, files=1)
    config = ShardConfig(inputs=(str(tmp_path / "in" / "*"),), output=str(tmp_path / "out"), tokenizer=tiny_tokenizer,
                         seq_len=64)
    plan = shard_plan.make_plan(config, committed=None)
    texts = ["hello world", "some more text\n\tindented", "ünïcödé 日本語"]

    def setup_and_encode():
        dofn = TokenizeChunk(plan)
        dofn.setup()
        return dofn, [np.asarray(ids).tolist() for ids in tokenizer.encode_batch(dofn.sp, texts)]

    before = worker_cache.loads()
    first, first_ids = setup_and_encode()
    assert worker_cache.loads() == before + 1
    second, second_ids = setup_and_encode()  # DaskRunner: a freshly unpickled DoFn for the next partition
    assert worker_cache.loads() == before + 1
    assert second.sp is first.sp and second.byte_mask is first.byte_mask
    assert second_ids == first_ids and all(first_ids)
