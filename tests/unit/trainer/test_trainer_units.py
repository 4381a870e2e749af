"""In-process trainer tests: model, cost model, partitioning, data order and loader state (fast, no torchrun)."""
from __future__ import annotations

import os
import types

import numpy as np
import pytest
import torch

from model_contract import ContractMismatchError, TFRecordCorruptError
from tests.trainer_fixtures import write_dataset
from trainer.checkpoint import latest_checkpoint
from trainer.config import DataConfig, model_config
from trainer.data import ShardLoader, make_labels
from trainer.dataset import open_dataset
from trainer.streams import merge_states
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


@pytest.fixture
def world_of_one():
    """An in-process gloo group of one, for checkpoint code that calls barriers."""
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield types.SimpleNamespace(rank=0)
    finally:
        dist.destroy_process_group()


def test_checkpoint_pruning_never_deletes_the_one_just_published(tmp_path, world_of_one):
    """A directory holding a longer earlier run (steps 80, 100): saving step 10 keeps step 10 as `latest`."""
    from trainer import checkpoint

    env = world_of_one
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
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


class _Crash(Exception):
    pass


def test_a_crash_at_any_point_of_publishing_leaves_latest_complete(tmp_path, world_of_one, monkeypatch):
    """Crash (an exception standing in for SIGKILL) at each rename of a save in turn: `latest` always names a
    complete checkpoint that loads. Writing `latest` before renaming step_N into place fails this."""
    from trainer import checkpoint

    env = world_of_one
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    real = {"rename": os.rename, "replace": os.replace}
    crash_at = 0
    while True:
        root = str(tmp_path / f"ck{crash_at}")
        checkpoint.save(root, 3, model, opt, {"n": 3}, env)
        calls = []

        def fs_op(kind):
            def op(src, dst, *a, **k):
                calls.append(kind)
                if len(calls) - 1 == crash_at:
                    raise _Crash(f"killed before {kind} {os.path.basename(src)} -> {os.path.basename(dst)}")
                return real[kind](src, dst, *a, **k)
            return op

        monkeypatch.setattr(os, "rename", fs_op("rename"))
        monkeypatch.setattr(os, "replace", fs_op("replace"))
        try:
            checkpoint.save(root, 6, model, opt, {"n": 6}, env)
            crashed = False
        except BaseException as e:  # DCP wraps a crash in its own writes in a CheckpointException (BaseException)
            from torch.distributed.checkpoint.api import CheckpointException
            assert isinstance(e, (_Crash, CheckpointException)), e
            crashed = True
        finally:
            monkeypatch.setattr(os, "rename", real["rename"])
            monkeypatch.setattr(os, "replace", real["replace"])
        latest = latest_checkpoint(root)  # raises if `latest` names an incomplete checkpoint
        meta = checkpoint.load(latest, model, opt, env)
        assert meta["n"] == meta["step"] in (3, 6)
        if not crashed:
            assert meta["step"] == 6
            break
        crash_at += 1
    assert crash_at >= 3  # DCP's metadata rename, the directory rename and the pointer replace each interrupted


def _clip_worker(rank: int, init_file: str, grads: dict, max_norm: float, out: str) -> None:
    """One pipeline stage of two: its parameters get the whole model's gradients, then the trainer clips."""
    import torch.distributed as dist

    from trainer.grad_sync import clip_grad_norm
    from trainer.partition import partition_model

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    spec = partition_model(CFG, 2)[rank]
    stage = GPTStage(CFG, spec.layers, first=spec.first, last=spec.last)
    for name, p in stage.named_parameters():
        p.grad = grads["tok_emb.weight" if name == "head.weight" else name].clone()  # the synced tied grad
    env = types.SimpleNamespace(pp=2, pp_rank=rank, is_first_stage=rank == 0, is_last_stage=rank == 1,
                                pp_group=dist.group.WORLD, device=torch.device("cpu"), dp=1)
    norm = clip_grad_norm(stage, max_norm, env)
    torch.save({"norm": float(norm), "grads": {n: p.grad for n, p in stage.named_parameters()}},
               os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_global_clip_norm_spans_pipeline_stages(tmp_path):
    """Two stages clip by the norm of the whole model's gradient (tied weight counted once), exactly as the
    unpipelined model does: a stage clipping by its own norm fails this."""
    import torch.multiprocessing as mp

    whole = build_gpt(CFG)
    g = torch.Generator().manual_seed(0)
    grads = {n: torch.randn(p.shape, generator=g) for n, p in whole.named_parameters()}
    for n, p in whole.named_parameters():
        p.grad = grads[n].clone()
    max_norm = 0.5
    expected_norm = float(torch.nn.utils.clip_grad_norm_(whole.parameters(), max_norm))
    mp.spawn(_clip_worker, args=(str(tmp_path / "init"), grads, max_norm, str(tmp_path)), nprocs=2)
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    for r in got:
        assert r["norm"] == pytest.approx(expected_norm, rel=1e-5)
    expected = dict(whole.named_parameters())
    for r in got:
        for name, grad in r["grads"].items():
            ref = expected["tok_emb.weight" if name == "head.weight" else name].grad
            torch.testing.assert_close(grad, ref, rtol=1e-5, atol=1e-7, msg=f"clipped gradient of {name}")


# ---------------------------------------------------------------------------------------------- damaged data
def _shard(d, i=0, n=3):
    return os.path.join(d, "gen-test", f"train-{i:05d}-of-{n:05d}.tfrecord")


def _records(path):
    from model_contract.tfrecord import read_records
    return list(read_records(path))


def _damaged(tmp_path, how):
    """A fresh dataset with shard 0 damaged in one of the ways a copy goes wrong."""
    from model_contract import frame_record
    d = write_dataset(str(tmp_path / how), seq_len=32, vocab=64, n_docs=200)
    path = _shard(d)
    if how == "cut":  # a copy that stopped at a record boundary: every record left is intact
        recs = _records(path)
        open(path, "wb").write(b"".join(frame_record(r) for r in recs[:-3]))
    elif how == "empty":
        open(path, "wb").close()
    elif how == "swapped":  # another valid shard of the dataset in its place
        assert os.path.getsize(_shard(d, 1)) != os.path.getsize(path)
        open(path, "wb").write(open(_shard(d, 1), "rb").read())
    elif how == "reordered":  # same size, same record count, valid framing: only the sha256 tells
        recs = _records(path)
        open(path, "wb").write(b"".join(frame_record(r) for r in reversed(recs)))
    return d


@pytest.mark.parametrize("how", ["cut", "empty", "swapped"])
def test_damaged_shard_is_refused_on_open_naming_it(tmp_path, how):
    from trainer.shard_files import DataIntegrityError
    d = _damaged(tmp_path, how)
    with pytest.raises(DataIntegrityError, match="shard gen-test/train-00000-of-00003.tfrecord: .* manifest says"):
        _loader(d, streams=2)


def test_verify_data_catches_a_same_size_replacement(tmp_path):
    from trainer.shard_files import prepare_shards
    d = _damaged(tmp_path, "reordered")
    manifest, mfile = open_dataset(DataConfig(path=d), CFG)
    _loader(d, streams=2)  # size and record count agree: only the content hash can tell
    cfg = DataConfig(path=d, verify_data=True)
    errors = prepare_shards(manifest, mfile, cfg, str(tmp_path / "idx"))
    assert len(errors) == 1 and "shard gen-test/train-00000-of-00003.tfrecord: sha256" in errors[0]
    # once per shard per node: split over the node's ranks, every shard checked by exactly one of them
    split = [prepare_shards(manifest, mfile, cfg, str(tmp_path / "idx"), r, 2) for r in range(2)]
    assert sum(split, []) == errors and split[0] == errors  # shard 0 is local rank 0's


def test_shard_path_outside_the_dataset_is_refused(tmp_path, dataset):
    import json
    from trainer.shard_files import DataIntegrityError
    d = tmp_path / "escape"
    d.mkdir()
    m = json.loads(open(os.path.join(dataset, "manifest.json")).read())
    for shard in m["shards"]:  # every file exists, reached through `..`: only containment can refuse it
        shard["path"] = "../" + os.path.basename(dataset) + "/" + shard["path"]
    (d / "manifest.json").write_text(json.dumps(m))
    # model_contract's one resolver refuses it when the manifest is read, naming the entry; the loader's own
    # containment check stays as a second line (DataIntegrityError) for manifests built in memory
    from model_contract import ContractError
    with pytest.raises((ContractError, DataIntegrityError),
                       match=r"(shards\[0\]\.path|shard) '\.\./.*(outside|escapes|not a relative path inside)"):
        _loader(str(d), streams=2)


def test_tokenizer_pin_is_checked_against_the_contract(dataset, tmp_path):
    from model_contract import load_manifest, manifest_path
    from trainer.dataset import tokenizer_pin
    model = tmp_path / "tok.model"
    model.write_bytes(b"not the tokenizer the data was made with")
    with pytest.raises(ContractMismatchError, match="tokenizer"):
        open_dataset(DataConfig(path=dataset, tokenizer=str(model)), CFG)
    sha = load_manifest(manifest_path(dataset)).contract.tokenizer.model_sha256
    open_dataset(DataConfig(path=dataset, tokenizer=sha), CFG)  # the right pin passes
    assert tokenizer_pin(str(model)) != sha


def test_record_offsets_are_cached_once_and_reused(dataset, tmp_path, monkeypatch):
    """The first loader walks each shard's headers once and caches the offsets; the next only reads the cache."""
    import trainer.shard_files as data
    walks = []
    real = data.record_offsets
    monkeypatch.setattr(data, "record_offsets", lambda f, **k: walks.append(k["name"]) or real(f, **k))
    manifest, mfile = open_dataset(DataConfig(path=dataset), CFG)
    cfg = DataConfig(path=dataset, streams=4, shuffle_buffer=16, index_dir=str(tmp_path / "idx"))
    a = ShardLoader(manifest, mfile, cfg, 32, 8)
    assert len(walks) == len(manifest.shards)
    b = ShardLoader(manifest, mfile, cfg, 32, 8)
    assert len(walks) == len(manifest.shards)
    assert [_ids(next(a)) for _ in range(3)] == [_ids(next(b)) for _ in range(3)]
    a.close()
    b.close()


def test_model_shape_defaults_from_the_dataset_contract(dataset):
    """The tiny preset (seq_len 128, vocab 8192) trains on a seq_len-32, vocab-64 dataset without flags; an explicit
    flag still wins, and a mismatch is refused naming the fix."""
    from trainer.args import parse_args
    cfg = parse_args(["--data", dataset, "--model", "tiny"], world=1)
    assert (cfg.model.seq_len, cfg.model.vocab_size) == (32, 64)
    assert parse_args(["--data", dataset, "--vocab-size", "128"], world=1).model.vocab_size == 128
    with pytest.raises(ContractMismatchError, match="set the model's seq_len to 32"):
        parse_args(["--data", dataset, "--seq-len", "64"], world=1)
