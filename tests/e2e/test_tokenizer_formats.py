"""The three tokenizer formats end to end: train (`pileprep tokenizer train`), shard, `verify --inputs` audit with
each format's own library, the trainer's contract check and data loader; bad tokenizer options exit 2."""
from __future__ import annotations

import json

import numpy as np
import pytest

from model_contract import ContractMismatchError, Manifest, decode_example, iter_records, resolve_shard_path
from pipeline import cli
from pipeline.config import ShardConfig
from pipeline.shard import shard_pipeline
from pipeline.tools import dry_run
from pipeline.tools.inspect_dataset import inspect
from pipeline.tools.report_data import decoded_examples
from pipeline.tools.sample_corpus import write_sample_corpus
from pipeline.tools.verify import verify
from tests.corpus_fixtures import pile_line, write_good_corpus
from tests.ops_fixtures import FAST_LOCAL, dataset_files, run_cli
from trainer.config import DataConfig, model_config
from trainer.data import ShardLoader
from trainer.dataset import open_dataset

SPECIAL_TEXT = "a <|endoftext|> b </s> c <s> d <|padding|><unk><pad> e\n"  # every special token, as text


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`pileprep tokenizer train --kind hf-bpe`: a tokenizer.json and the tiktoken file beside it."""
    corpus = tmp_path_factory.mktemp("corpus")
    write_sample_corpus(str(corpus), target_mb=1)
    out = tmp_path_factory.mktemp("hf") / "tok" / "tokenizer.json"
    proc = run_cli(["tokenizer", "train", "--kind", "hf-bpe", "--input", f"{corpus}/train/*.jsonl.zst",
                    "--output", str(out), "--vocab-size", "600"], timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, json.loads(proc.stdout)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("in")
    write_good_corpus(root, limit_bytes=120_000, files=2)
    (root / "special.jsonl").write_bytes(b"".join(pile_line(SPECIAL_TEXT * (i + 1), "Special") for i in range(6)))
    return root


def _eos_count(manifest_file: str) -> int:
    manifest = Manifest.from_json(open(manifest_file).read())
    eos, total = manifest.contract.tokenizer.eos_id, 0
    for shard in manifest.shards:
        with open(resolve_shard_path(manifest_file, shard), "rb") as f:
            records = list(iter_records(f))
        for record in records:
            ex = decode_example(record)
            total += int(((ex["input_ids"] == eos) & (ex["segment_ids"] > 0)).sum())
    return total


@pytest.mark.parametrize("kind", ["sentencepiece", "hf-tokenizer-json", "tiktoken"])
def test_each_format_shards_exactly_and_the_trainer_reads_it(kind, trained, corpus, tiny_tokenizer, tmp_path):
    json_path, summary = trained
    tik = summary["tiktoken"]
    path, options = {"sentencepiece": (tiny_tokenizer, {}),
                     "hf-tokenizer-json": (str(json_path.parent), {}),  # a directory holding tokenizer.json
                     "tiktoken": (tik["output"], {"tokenizer_pattern": tik["pattern"],
                                                  "special_tokens": tik["special_tokens"]})}[kind]
    out = tmp_path / "ds"
    cfg = ShardConfig(inputs=(str(corpus / "*"),), output=str(out), tokenizer=path, seq_len=128, num_shards=1,
                      val_fraction=0.0, test_fraction=0.0, **options)
    shard_pipeline.run(cfg, FAST_LOCAL, progress_every_s=0)
    manifest = Manifest.from_json((out / "manifest.json").read_text())
    t = manifest.contract.tokenizer
    assert manifest.contract.version == "1.4" and t.kind == kind and t.special_token_policy == "text"
    assert (t.eos_token, t.eos_id) == {"sentencepiece": ("</s>", 3)}.get(kind, ("<|endoftext|>", 0))
    # every document audited against the format's own library: stored ids == reference ids + EOS
    report = verify(str(out), inputs=[str(corpus / "*")], sample=10_000)
    assert report.ok and report.audit.problems == [] and report.audit.documents == manifest.records["read"]
    # one EOS per document: no document's text injected another (the special-token documents included)
    assert _eos_count(str(out / "manifest.json")) == manifest.records["written"]
    # the trainer: vocabulary and EOS from the contract, the tokenizer pinned by its file (or directory)
    model = model_config("tiny", seq_len=128, vocab_size=-(-t.vocab_size // 64) * 64, n_layers=1, d_model=32,
                         n_heads=2)
    manifest2, mfile = open_dataset(DataConfig(path=str(out), tokenizer=path), model)
    batch = next(ShardLoader(manifest2, mfile, DataConfig(path=str(out), streams=1, shuffle_buffer=1), 128, 2))
    ids = np.asarray(batch["input_ids"])
    assert ids.shape == (2, 128) and 0 <= int(ids.min()) and int(ids.max()) < t.vocab_size
    with pytest.raises(ContractMismatchError, match="tokenizer"):
        open_dataset(DataConfig(path=str(out), tokenizer="0" * 64), model)
    # the report and inspect decode with the same tokenizer and options (a tiktoken file's pattern: the
    # contract's): the first piece's text, not its ids ...
    shown = decoded_examples(str(out / "manifest.json"), manifest)["train"]
    assert shown["note"] == "" and isinstance(shown["text"], str) and shown["text"].strip(), shown
    excerpt = inspect(str(out), examples=1).splitlines()[-1]
    assert excerpt.strip() and not excerpt.startswith("["), excerpt
    # ... and the dry run loads it as the job does
    never = tmp_path / "never"
    est = dry_run.estimate(ShardConfig(**{**cfg.__dict__, "output": str(never)}), FAST_LOCAL, calibrated=False)
    assert est.tokens_per_split["train"] > 0 and not never.exists()
    if kind == "hf-tokenizer-json":  # two backends read a tokenizer.json: gigatoken (auto's pick) and tokenizers
        assert manifest.extra["tokenizer_backend"]["name"] == "gigatoken"
        ref = tmp_path / "reference"
        shard_pipeline.run(ShardConfig(**{**cfg.__dict__, "output": str(ref), "tokenizer_backend": "reference"}),
                           FAST_LOCAL, progress_every_s=0)
        a, b = dataset_files(out), dataset_files(ref)
        ran = json.loads(b["manifest.json"])["tokenizer_backend"]["name"]
        assert ran == "tokenizers" and a.keys() == b.keys()
        assert [k for k in a if "manifest.json" not in k and a[k] != b[k]] == []  # only the manifests name it


def test_bad_tokenizer_options_exit_2_with_one_line(trained, corpus, tmp_path, capsys):
    json_path, summary = trained
    not_tok = tmp_path / "tokenizer.json"
    not_tok.write_text('{"version": "1.0"}')
    args = ["shard", "--input", str(corpus / "*"), "--output", str(tmp_path / "o")]
    # the whole command once (a process of its own: exit status and stderr as a user sees them) ...
    proc = run_cli([*args, "--tokenizer", str(not_tok), *FAST_LOCAL], timeout_s=120)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr[-1500:]
    assert "SentencePiece .model, an HF tokenizer.json" in proc.stderr and "INTERNAL" not in proc.stderr
    # ... and the other cases through the same entry point in this process
    cases = [
        (["--tokenizer", summary["tiktoken"]["output"]], "--tokenizer-pattern is required"),
        (["--tokenizer", str(json_path), "--eos-token", "<|nope|>"], "--eos-token '<|nope|>' is not in"),
        (["--tokenizer", str(json_path), "--tokenizer-backend", "sentencepiece"], "--tokenizer-backend sentencepiece"),
    ]
    for extra, wanted in cases:
        capsys.readouterr()
        assert cli.main([*args, *extra, *FAST_LOCAL]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and wanted in err and "Traceback" not in err, (extra, err[-1500:])
    assert not (tmp_path / "o" / "manifest.json").exists()
