"""trainer/dataset.py: the contract checked against the model (every difference listed, the --tokenizer pin),
against its limits and against the first record, before any model is built (the synthetic datasets of
tests/trainer_fixtures.py)."""
from __future__ import annotations

import pytest
import torch

from model_contract import ContractMismatchError
from tests.trainer_fixtures import edit_manifest
from trainer.config import DataConfig, model_config
from trainer.dataset import open_dataset
from trainer.shard_files import DataIntegrityError

torch.set_num_threads(1)


CFG = model_config("tiny", seq_len=32, vocab_size=64, n_layers=3, d_model=32, n_heads=2)


def test_contract_mismatch_lists_every_difference(shared_dataset):
    with pytest.raises(ContractMismatchError) as e:
        open_dataset(DataConfig(path=shared_dataset), CFG.replace(seq_len=64, vocab_size=16))
    text = str(e.value)
    assert "seq_len: data has 32" in text and "vocab_size" in text and len(e.value.mismatches) == 5


def test_tokenizer_pin_is_checked_against_the_contract(shared_dataset, tmp_path):
    from model_contract import load_manifest, manifest_path
    from trainer.dataset import tokenizer_pin
    model = tmp_path / "tok.model"
    model.write_bytes(b"not the tokenizer the data was made with")
    with pytest.raises(ContractMismatchError, match="tokenizer"):
        open_dataset(DataConfig(path=shared_dataset, tokenizer=str(model)), CFG)
    sha = load_manifest(manifest_path(shared_dataset)).contract.tokenizer.model_sha256
    open_dataset(DataConfig(path=shared_dataset, tokenizer=sha), CFG)  # the right pin passes
    assert tokenizer_pin(str(model)) != sha


@pytest.mark.parametrize("field,value", [("seq_len", 100_000_000), ("vocab_size", 2_000_000_000)])
def test_contract_beyond_the_limits_is_refused_in_one_line_before_the_model(dataset, field, value):
    def huge(m):
        if field == "seq_len":
            m["contract"]["seq_len"] = value
        else:
            m["contract"]["tokenizer"]["vocab_size"] = value

    edit_manifest(dataset, huge)
    model = model_config("tiny", seq_len=value if field == "seq_len" else 32,
                         vocab_size=value if field == "vocab_size" else 64, n_layers=2, d_model=32, n_heads=2)
    with pytest.raises(DataIntegrityError, match=f"contract [a-z_.]*{field} {value} is outside") as e:
        open_dataset(DataConfig(path=dataset), model)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("field,value,message", [("seq_len", 64, "record 0 has 32 tokens, the contract's seq_len is 64"),
                                                 ("vocab_size", 8, "outside the contract's vocab_size 8")])
def test_contract_contradicted_by_the_first_record_is_refused(dataset, field, value, message):
    def lie(m):
        if field == "seq_len":
            m["contract"]["seq_len"] = value
            for f in m["contract"]["features"]:
                if f.get("shape"):
                    f["shape"] = [value]
        else:
            m["contract"]["tokenizer"]["vocab_size"] = value

    edit_manifest(dataset, lie)
    model = model_config("tiny", seq_len=value if field == "seq_len" else 32,
                         vocab_size=64, n_layers=2, d_model=32, n_heads=2)
    with pytest.raises(DataIntegrityError, match=message):
        open_dataset(DataConfig(path=dataset), model)
