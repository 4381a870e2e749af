"""The dense retrieval encoder decodes chunk text with the dataset's own tokenizer options: a tiktoken file
cannot be loaded without its split pattern and special tokens, which live in the dataset's contract
(pipeline/retrieval/build_index.py ChunkTexts, pipeline/retrieval/neighbours.py Searcher)."""
from __future__ import annotations

import types

from pipeline.retrieval.build_index import ChunkTexts
from pipeline.retrieval.build_plan import BuildPlan
from transforms.tokenize import tokenizer


def test_chunk_texts_decode_a_tiktoken_dataset_with_the_contracts_options(hf_bpe):
    _json_path, summary = hf_bpe
    tik = summary["tiktoken"]
    model = open(tik["output"], "rb").read()
    options = tokenizer.options_of(types.SimpleNamespace(tokenizer_pattern=tik["pattern"],
                                                         special_tokens=tik["special_tokens"], eos_token=""))
    reference = tokenizer.load_processor(model, tik["output"], options)
    info = tokenizer.describe(reference, model, options)
    plan = BuildPlan(config=None, dataset_manifest={"contract": {"tokenizer": info.to_dict()}}, shard_paths=(),
                     input_paths=(), generation="gen-0000000000000000", fingerprint="0", encoder={},
                     model_bytes=model)
    fn = ChunkTexts(plan)
    fn.setup()
    text = "def chunk(x):\n    return x <|endoftext|> tail"
    assert fn.sp.decode(reference.encode(text)) == text
