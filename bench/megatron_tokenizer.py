"""Llama 2's SentencePiece model as a HuggingFace tokenizer dir, for Megatron-LM's fast script (issue 30).

    python bench/megatron_tokenizer.py [--tokenizer MODEL] [--out DIR] [--check CORPUS.jsonl ...]

Megatron-LM's `tools/preprocess_data_fast.py --use-gigatoken` needs an HF tokenizer (`--tokenizer-type
HuggingFaceTokenizer --tokenizer-model DIR`): gigatoken wraps the HF tokenizer Megatron loads with
`AutoTokenizer.from_pretrained(DIR)`. Built offline here with `transformers`:

1. `LlamaTokenizerFast(vocab=..., merges=..., legacy=True)`: the vocabulary is the model's pieces in id order;
2. the merges are regenerated ORDERED BY PIECE SCORE: SentencePiece's BPE merges, again and again, the adjacent
   pair whose concatenation is a normal piece of the highest score; HF's BPE merges the listed pair of lowest
   rank. So the list is every split of every normal piece into two normal pieces, ranked by the merged piece's
   score (highest first; ties by the merged piece's id, then the left part's id). transformers' own
   SentencePieceExtractor orders them by id, which tokenizes some words differently;
3. Llama 2's normalizer layout, `Prepend("▁") + Replace(" ", "▁")`, and no pre-tokenizer: transformers' Metaspace
   pre-tokenizer splits at every `▁` (runs of spaces then tokenize differently) and its legacy prepend scheme
   treats a document that starts with a space differently from SentencePiece;
4. no post-processor template tokens (Megatron appends the EOD itself);
5. `tokenizer_class: PreTrainedTokenizerFast` in tokenizer_config.json: transformers 5 rebuilds a LlamaTokenizer's
   normalizer and pre-tokenizer on load (the Metaspace layout again); the generic class loads tokenizer.json as is.

`<s>`, `</s>` and `<unk>` stay the tokenizer's special (added) tokens, as in every HF Llama 2 dir: a document
holding that literal text gets one control token where SentencePiece (and pileprep) tokenize the characters.
That is the known inexactness of Megatron's fast path; `check` counts it on every document of a corpus.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

VERSION = 2  # bump when the dir's bytes change
SPECIAL_TEXT = ("<s>", "</s>", "<unk>")


def _model_sha(model: str) -> str:
    with open(model, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def score_ordered(model: str) -> tuple:
    """(vocab {piece: id}, merges [(left, right)] ordered by the merged piece's score) of a SentencePiece BPE model,
    read with sentencepiece's own API (not pileprep's model reader: this dir is the measuring stick)."""
    import sentencepiece as spm  # noqa: PLC0415

    sp = spm.SentencePieceProcessor(model_file=model)
    n = sp.get_piece_size()
    vocab = {sp.id_to_piece(i): i for i in range(n)}
    normal = {sp.id_to_piece(i) for i in range(n)
              if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i) or sp.is_unused(i))}
    ranked = []
    for piece in normal:
        i = vocab[piece]
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                ranked.append((-sp.get_score(i), i, vocab[left], left, right))
    ranked.sort()
    return vocab, [(left, right) for *_key, left, right in ranked]


def build_hf_dir(model: str, out: str) -> str:
    """The HF tokenizer dir for `model` under `out` (cached: rebuilt when the model or VERSION changes)."""
    stamp = os.path.join(out, ".bench-stamp.json")
    key = {"model": _model_sha(model), "version": VERSION}
    if os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == key:
                return out
    from tokenizers import normalizers  # noqa: PLC0415
    from transformers import LlamaTokenizerFast  # noqa: PLC0415

    vocab, merges = score_ordered(model)
    tok = LlamaTokenizerFast(vocab=vocab, merges=merges, legacy=True, add_bos_token=False, add_eos_token=False)
    backend = tok.backend_tokenizer
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = None
    backend.post_processor = None
    os.makedirs(out, exist_ok=True)
    tok.save_pretrained(out)
    # transformers 5's LlamaTokenizer rebuilds its own normalizer and Metaspace pre-tokenizer when it loads a dir,
    # whatever tokenizer.json says (measured: " leading" then loses its "▁"); the generic class loads the file as
    # it is, and AutoTokenizer (what Megatron calls) picks the class from tokenizer_config.json
    config_path = os.path.join(out, "tokenizer_config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    with open(config_path, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    from transformers import AutoTokenizer  # noqa: PLC0415

    spec = json.loads(AutoTokenizer.from_pretrained(out).backend_tokenizer.to_str())
    got = (spec["pre_tokenizer"], [n["type"] for n in (spec["normalizer"] or {}).get("normalizers", [])],
           len(spec["model"]["merges"]))
    if got != (None, ["Prepend", "Replace"], len(merges)):
        raise SystemExit(f"AutoTokenizer.from_pretrained({out}) lost the layout: {got}")
    with open(stamp, "w") as f:
        json.dump(key, f)
    return out


def load_gigatoken(hf_dir: str):
    """What Megatron's HuggingFaceTokenizer(use_gigatoken=True) runs: gigatoken over AutoTokenizer(dir)
    (megatron/core/tokenizers/text/libraries/huggingface_tokenizer.py)."""
    import gigatoken as gt  # noqa: PLC0415
    from transformers import AutoTokenizer  # noqa: PLC0415

    return gt.Tokenizer(AutoTokenizer.from_pretrained(hf_dir)).as_hf()


def check(hf_dir: str, model: str, jsonl: str, show: int = 3) -> dict:
    """Every document of `jsonl`: Megatron's fast-path tokens (gigatoken's encode_files over the dir, as
    preprocess_data_fast.py calls it) against `sp.encode(text)`. Differing documents are counted, and split by
    whether their text holds a literal <s>, </s> or <unk> (the expected, known differences)."""
    import gigatoken as gt  # noqa: PLC0415
    import sentencepiece as spm  # noqa: PLC0415

    start = time.perf_counter()
    fast = load_gigatoken(hf_dir).tokenizer.encode_files(gt.JsonlFileSource([jsonl], field="text"), parallel=True)
    sp = spm.SentencePieceProcessor(model_file=model)
    result = {"corpus": jsonl, "documents": 0, "tokens": 0, "differ": 0, "differ_special_text": 0,
              "differ_other": 0, "examples": []}
    with open(jsonl, encoding="utf-8") as f:
        for i, line in enumerate(f):
            text = json.loads(line)["text"]
            want = sp.encode(text)
            got = fast[i].to_list()
            result["documents"] += 1
            result["tokens"] += len(want)
            if got == want:
                continue
            result["differ"] += 1
            if any(s in text for s in SPECIAL_TEXT):
                result["differ_special_text"] += 1
                continue
            result["differ_other"] += 1
            if len(result["examples"]) < show:
                at = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                result["examples"].append({"document": i, "first_difference_at_token": at,
                                           "text_near": sp.decode(want[max(0, at - 3):at + 3])})
    if len(fast) != result["documents"]:
        raise SystemExit(f"gigatoken read {len(fast)} documents of {jsonl}, json {result['documents']}")
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def main(argv=None) -> int:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from shard_bench import REPO, SHARED_TOKENIZER  # noqa: PLC0415

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", default=SHARED_TOKENIZER, help="SentencePiece BPE model (Llama 2's)")
    p.add_argument("--out", default=os.path.join(REPO, "out", "bench", "llama2-hf"))
    p.add_argument("--check", nargs="*", default=[], metavar="JSONL",
                   help="plain .jsonl corpora ({'text': ...} lines) to compare against sentencepiece")
    args = p.parse_args(argv)
    print(build_hf_dir(args.tokenizer, args.out), flush=True)
    for jsonl in args.check:
        print(json.dumps(check(args.out, args.tokenizer, jsonl), ensure_ascii=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
