"""trainer/args.py: the command line as a person meets it (--help defaults) and the configuration checked
before any process-group work, each refusal one line: a huge vocabulary, a model past the host's memory, a
checkpoint directory holding a pileprep output; the model shape from the dataset's contract."""
from __future__ import annotations

import os

import pytest
import torch

from model_contract import ContractMismatchError
from tests.trainer_fixtures import edit_manifest

torch.set_num_threads(1)


def _help_of(parser, flag):
    return next(a.help for a in parser._actions if flag in a.option_strings)


def test_help_shows_every_default_and_the_inverted_flags_say_what_they_do():
    from trainer.args import _parser
    p = _parser()
    missing = [a.option_strings[0] for a in p._actions
               if a.option_strings and a.option_strings[0] != "-h" and "default" not in (a.help or "")]
    assert not missing, f"options whose --help shows no default: {missing}"
    assert _help_of(p, "--no-resume").startswith("start fresh")
    assert "fp32" in _help_of(p, "--no-bf16").split("(")[0]
    assert "(default: 40)" in _help_of(p, "--steps")
    text = p.format_help()  # argparse %-formats every help string: a stray % would raise here
    assert "--no-resume" in text


def test_trainer_cli_refuses_a_huge_vocab_in_one_line(dataset, capfd):
    from trainer.train import main

    edit_manifest(dataset, lambda m: m["contract"]["tokenizer"].update(vocab_size=2_000_000_000))
    assert main(["--data", dataset, "--model", "tiny", "--steps", "1", "--global-batch", "4", "--device",
                 "cpu"]) == 2
    err = capfd.readouterr().err
    assert "vocab_size 2000000000 is outside" in err and len(err.strip().splitlines()) == 1


def test_trainer_cli_refuses_a_contract_whose_model_exceeds_the_host_by_the_plan(dataset, capfd, monkeypatch):
    """A vocab within trainer/dataset.py's limits still sizes a model past this host's memory: the plan refuses it
    in one line before any allocation (tiny model: 2 x 16M x d_model embedding + head with AdamW state)."""
    from trainer import args, train

    edit_manifest(dataset, lambda m: m["contract"]["tokenizer"].update(vocab_size=16_000_000))
    monkeypatch.setattr(args, "host_memory_bytes", lambda: 8 * 2**30)  # a small host, whatever runs the test
    assert train.main(["--data", dataset, "--model", "tiny", "--steps", "1", "--global-batch", "4", "--device",
                       "cpu"]) == 2
    err = capfd.readouterr().err
    assert "exceeds this host's 8.0 GiB" in err and "vocab 16000000" in err and len(err.strip().splitlines()) == 1


def test_trainer_refuses_a_checkpoint_dir_holding_a_pileprep_output(dataset, capfd):
    """--checkpoint-dir naming the dataset wrote step_*/, latest and the offsets cache among its files (exit 0);
    trainer/args.py `check_checkpoint_dir` refuses any directory with a manifest.json, before any work."""
    from trainer.train import main

    before = sorted(os.listdir(dataset))
    assert main(["--data", dataset, "--model", "tiny", "--steps", "1", "--global-batch", "4", "--device", "cpu",
                 "--checkpoint-dir", dataset]) == 2
    err = capfd.readouterr().err
    assert f"--checkpoint-dir {dataset}: it holds a pileprep output" in err and len(err.strip().splitlines()) == 1
    assert sorted(os.listdir(dataset)) == before


def test_model_shape_defaults_from_the_dataset_contract(shared_dataset):
    """The tiny preset (seq_len 128, vocab 8192) trains on a seq_len-32, vocab-64 dataset without flags; an explicit
    flag still wins, and a mismatch is refused naming the fix."""
    from trainer.args import parse_args
    cfg = parse_args(["--data", shared_dataset, "--model", "tiny"], world=1)
    assert (cfg.model.seq_len, cfg.model.vocab_size) == (32, 64)
    assert parse_args(["--data", shared_dataset, "--vocab-size", "128"], world=1).model.vocab_size == 128
    with pytest.raises(ContractMismatchError, match="set the model's seq_len to 32"):
        parse_args(["--data", shared_dataset, "--seq-len", "64"], world=1)
