"""In-process trainer tests: model, cost model, partitioning, data order and loader state (fast, no torchrun)."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from model_contract import ContractMismatchError, TFRecordCorruptError
from tests.trainer_fixtures import write_dataset
from trainer.checkpoint import latest_checkpoint
from trainer.config import DataConfig, model_config
from trainer.data import ShardLoader, make_labels, merge_states, open_dataset
from trainer.model import IGNORE_INDEX, GPTStage, attention_mask, build_gpt
from trainer.partition import (balanced_splits, even_splits, model_units, partition_model, stage_loads,
                               unit_costs)

torch.set_num_threads(1)
CFG = model_config("tiny", seq_len=32, vocab_size=64, n_layers=3, d_model=32, n_heads=2)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return write_dataset(str(tmp_path_factory.mktemp("units-data")), seq_len=32, vocab=64, n_docs=400)


# ---------------------------------------------------------------------------------------------- model
def test_param_count_and_flops_from_config():
    assert sum(p.numel() for p in build_gpt(CFG).parameters()) == CFG.num_params()
    untied = CFG.replace(tie_embeddings=False)
    assert sum(p.numel() for p in build_gpt(untied).parameters()) == untied.num_params()
    sizes = {n: model_config(n).num_params() / 1e9 for n in ("125M", "1.3B", "6.7B")}
    assert sizes["125M"] == pytest.approx(0.125, rel=0.05)
    assert sizes["1.3B"] == pytest.approx(1.3, rel=0.05)
    assert sizes["6.7B"] == pytest.approx(6.7, rel=0.05)
    c = model_config("1.3B")  # ~6N + 12 L d T
    n = c.n_layers * 12 * c.d_model ** 2 + c.vocab_size * c.d_model
    assert c.flops_per_token() == pytest.approx(6 * n + 12 * c.n_layers * c.d_model * c.seq_len, rel=0.01)


def test_attention_never_crosses_documents():
    model = build_gpt(CFG).eval()
    ids = torch.randint(2, 64, (1, 32))
    seg = torch.tensor([[1] * 10 + [2] * 14 + [3] * 5 + [0] * 3])
    pos = torch.cat([torch.arange(10), torch.arange(14), torch.arange(5), torch.zeros(3, dtype=torch.long)])[None]
    out = model(ids, pos, seg)
    ids2 = ids.clone()
    ids2[0, :10] = torch.randint(2, 64, (10,))  # change document 1 only
    out2 = model(ids2, pos, seg)
    torch.testing.assert_close(out[0, 10:], out2[0, 10:])  # documents 2, 3 and padding unaffected
    assert not torch.allclose(out[0, :10], out2[0, :10])
    m = attention_mask(seg)[0, 0]
    assert m[12, 11] and not m[12, 9] and not m[11, 12]


def test_stages_compose_to_the_whole_model():
    full = build_gpt(CFG)
    s0 = GPTStage(CFG, [0, 1], first=True, last=False)
    s1 = GPTStage(CFG, [2], first=False, last=True)
    ids = torch.randint(0, 64, (2, 32))
    pos = torch.arange(32).expand(2, 32)
    seg = torch.ones(2, 32, dtype=torch.long)
    torch.testing.assert_close(s1(*s0(ids, pos, seg)), full(ids, pos, seg))
    torch.testing.assert_close(s1.head.weight, full.tok_emb.weight)  # tied copy starts equal


# ---------------------------------------------------------------------------------------------- partition
@pytest.mark.parametrize("layers,stages", [(1, 2), (3, 2), (5, 3), (7, 4), (12, 5), (24, 8)])
def test_partition_never_drops_a_layer(layers, stages):
    cfg = CFG.replace(n_layers=layers)
    for method in ("flops", "even"):
        specs = partition_model(cfg, stages, method)
        assert [l for s in specs for l in s.layers] == list(range(layers))
        assert specs[0].first and specs[-1].last and all(s.units for s in specs)


def test_auto_partition_balances_an_uneven_model():
    """5 blocks + a vocabulary head as big as 4 blocks on 2 stages: layer-count splitting overloads the last
    stage; the balanced split moves blocks to stage 0 and is optimal (checked by brute force)."""
    cfg = CFG.replace(n_layers=5, vocab_size=4096, d_model=64, n_heads=4)
    units = model_units(cfg)
    costs = unit_costs(units)
    auto = partition_model(cfg, 2, "flops")
    even = partition_model(cfg, 2, "even")
    auto_max, even_max = max(stage_loads(units, auto, costs)), max(stage_loads(units, even, costs))
    assert auto_max < even_max
    brute = min(max(sum(costs[:k]), sum(costs[k:])) for k in range(1, len(costs)))
    assert auto_max == pytest.approx(brute)


def test_partition_uses_measured_times():
    times = [0.1] + [1.0, 1.0, 5.0] + [0.1]  # block 2 measured 5x slower (e.g. a slow device)
    specs = partition_model(CFG, 2, "profile", times=times, time_weight=1.0)
    assert specs[1].layers == (2,)
    assert even_splits(5, 2) == [(0, 3), (3, 5)]
    assert balanced_splits([1, 1, 1, 1], 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ValueError, match="cannot fill"):
        balanced_splits([1, 1], 3)


# ---------------------------------------------------------------------------------------------- data
def _loader(dataset, dp_rank=0, dp=1, seed=0, streams=4, gb=8, buf=16):
    manifest, mfile = open_dataset(DataConfig(path=dataset), CFG)
    return ShardLoader(manifest, mfile, DataConfig(path=dataset, seed=seed, streams=streams, shuffle_buffer=buf),
                       32, gb, dp_rank, dp)


def _ids(batch):
    return [tuple(r) for r in batch["input_ids"].tolist()]


def test_contract_mismatch_lists_every_difference(dataset):
    with pytest.raises(ContractMismatchError) as e:
        open_dataset(DataConfig(path=dataset), CFG.replace(seq_len=64, vocab_size=16))
    text = str(e.value)
    assert "seq_len: data has 32" in text and "vocab_size" in text and len(e.value.mismatches) == 5


def test_data_order_is_deterministic_and_seeded(dataset):
    la, lb, lc = _loader(dataset), _loader(dataset), _loader(dataset, seed=1)
    a = [_ids(next(la)) for _ in range(5)]
    assert a == [_ids(next(lb)) for _ in range(5)]
    assert a != [_ids(next(lc)) for _ in range(5)]


def test_dp_ranks_split_the_same_global_batches(dataset):
    whole = _loader(dataset)
    r0, r1 = _loader(dataset, 0, 2), _loader(dataset, 1, 2)
    for _ in range(6):
        assert _ids(next(whole)) == _ids(next(r0)) + _ids(next(r1))


def test_epoch_sees_every_example_at_most_once_and_drops_remainder(dataset):
    loader = _loader(dataset)
    seen = []
    for _ in range(loader.steps_per_epoch):
        seen += _ids(next(loader))
    total = sum(s.examples for s in open_dataset(DataConfig(path=dataset), CFG)[0].shards)
    assert len(seen) == loader.steps_per_epoch * 8 > total - 4 * 8
    # no record repeated: the seen examples are a sub-multiset of all records in the shards
    from collections import Counter
    from model_contract import decode_example, read_records
    manifest, mfile = open_dataset(DataConfig(path=dataset), CFG)
    every = Counter(tuple(decode_example(r)["input_ids"].tolist())
                    for s in manifest.shards for r in read_records(os.path.join(dataset, s.path)))
    assert not Counter(seen) - every
    next(loader)
    assert loader.epoch == 1 and loader.step_in_epoch == 1


@pytest.mark.parametrize("new_dp", [1, 2, 4])
def test_resume_mid_epoch_with_any_dp_size_sees_the_same_batches(dataset, new_dp):
    ref = _loader(dataset)
    expected = [_ids(next(ref)) for _ in range(12)]
    ranks = [_loader(dataset, r, 2) for r in range(2)]
    for _ in range(7):
        for r in ranks:
            next(r)
    state = merge_states([r.state_dict() for r in ranks])
    resumed = [_loader(dataset, r, new_dp) for r in range(new_dp)]
    for r in resumed:
        r.load_state_dict(state)
    for step in range(7, 12):
        got = sum((_ids(next(r)) for r in resumed), [])
        assert got == expected[step], step


def test_labels_mask_document_boundaries_and_padding():
    ids = np.array([[5, 6, 1, 7, 8, 1, 0, 0]])
    seg = np.array([[1, 1, 1, 2, 2, 2, 0, 0]])
    assert make_labels(ids, seg).tolist() == [[6, 1, IGNORE_INDEX, 8, 1, IGNORE_INDEX, IGNORE_INDEX,
                                               IGNORE_INDEX]]


def test_corrupt_shard_is_an_error(tmp_path):
    d = write_dataset(str(tmp_path), seq_len=32, vocab=64, n_docs=100, n_shards=1)
    path = os.path.join(d, "gen-test", "train-00000-of-00001.tfrecord")
    data = bytearray(open(path, "rb").read())
    data[40] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(TFRecordCorruptError):
        loader = _loader(d, streams=1)
        for _ in range(loader.steps_per_epoch):
            next(loader)


def test_incomplete_checkpoint_is_never_latest(tmp_path):
    """A crash while saving leaves step_N.tmp behind; `latest` still names the previous complete checkpoint."""
    root = tmp_path / "ck"
    (root / "step_00000004").mkdir(parents=True)
    (root / "step_00000004" / "meta.json").write_text("{}")
    (root / "latest").write_text("step_00000004")
    (root / "step_00000008.tmp").mkdir()  # the interrupted save
    assert latest_checkpoint(str(root)) == str(root / "step_00000004")
    assert latest_checkpoint(str(tmp_path / "none")) is None


def test_loader_refuses_a_checkpoint_taken_on_another_shard_list(dataset, tmp_path):
    """An --incremental commit adds shards: saved (shard index, offset) positions would point elsewhere."""
    state = merge_states([_loader(dataset).state_dict()])
    grown = write_dataset(str(tmp_path / "grown"), seq_len=32, vocab=64, n_docs=500)
    other = _loader(grown)
    with pytest.raises(ValueError, match="shard list changed"):
        other.load_state_dict(state)
    same = _loader(dataset)
    same.load_state_dict(state)  # the same dataset resumes fine


def test_checkpoint_pruning_never_deletes_the_one_just_published(tmp_path):
    """A directory holding a longer earlier run (steps 80, 100): saving step 10 keeps step 10 as `latest`."""
    import socket
    import types

    import torch.distributed as dist

    from trainer import checkpoint

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.AdamW(model.parameters())
        env = types.SimpleNamespace(rank=0)
        root = str(tmp_path / "ckpt")
        for step in (80, 100, 10):
            checkpoint.save(root, step, model, opt, {}, env, keep=2)
        assert latest_checkpoint(root) == os.path.join(root, "step_00000010")
        assert os.path.exists(os.path.join(root, "step_00000010", "meta.json"))
        assert {"step_00000080", "step_00000100"} <= set(os.listdir(root))
        for step in (20, 30):
            checkpoint.save(root, step, model, opt, {}, env, keep=2)
        kept = sorted(d for d in os.listdir(root) if d.startswith("step_00000") and int(d[5:]) <= 30)
        assert kept == ["step_00000020", "step_00000030"]  # older steps of this run pruned to keep=2
    finally:
        dist.destroy_process_group()
