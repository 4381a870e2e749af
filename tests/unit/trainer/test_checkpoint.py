"""The trainer's checkpoint directory (trainer/checkpoint.py): `latest` only ever names a complete checkpoint
(an interrupted save, a crash at any point of publishing, pruning never the one just published); a save removes
only what a crashed save of its own left (`step_N.tmp`, `latest.tmp`), never a user's `*.tmp`; pruning and
replacing remove a link itself, never what it points at."""
from __future__ import annotations

import os
import types

import pytest
import torch

from trainer import checkpoint
from trainer.checkpoint import latest_checkpoint

torch.set_num_threads(1)


def test_incomplete_checkpoint_is_never_latest(tmp_path):
    """A crash while saving leaves step_N.tmp behind; `latest` still names the previous complete checkpoint."""
    root = tmp_path / "ck"
    (root / "step_00000004").mkdir(parents=True)
    (root / "step_00000004" / "meta.json").write_text("{}")
    (root / "latest").write_text("step_00000004")
    (root / "step_00000008.tmp").mkdir()  # the interrupted save
    assert latest_checkpoint(str(root)) == str(root / "step_00000004")
    assert latest_checkpoint(str(tmp_path / "none")) is None


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


def _written(root, step):
    tmp = root / f"step_{step:08d}.tmp"
    tmp.mkdir(parents=True)
    (tmp / "meta.json").write_text("{}")
    return str(tmp), str(root / f"step_{step:08d}")


def test_a_save_removes_only_what_a_crashed_save_left(tmp_path):
    root = tmp_path / "ck"
    root.mkdir()
    (root / "notes.tmp").write_text("a user's file")
    (root / "step_00000004.tmp").mkdir()
    (root / "latest.tmp").write_text("step_00000004")
    checkpoint.remove_stale(str(root))
    assert sorted(os.listdir(root)) == ["notes.tmp"]


def test_pruning_and_replacing_remove_links_not_their_targets(tmp_path):
    root, elsewhere = tmp_path / "ck", tmp_path / "elsewhere"
    (elsewhere / "old").mkdir(parents=True)
    (elsewhere / "old" / "meta.json").write_text("kept")
    (elsewhere / "same").mkdir()
    (elsewhere / "same" / "meta.json").write_text("kept too")
    root.mkdir()
    os.symlink(elsewhere / "old", root / "step_00000001")  # an older step: pruned (keep=1)
    os.symlink(elsewhere / "same", root / "step_00000002")  # the step being published: replaced
    tmp, final = _written(root, 2)
    checkpoint.publish(str(root), tmp, final, 2, keep=1)
    assert sorted(os.listdir(root)) == ["latest", "step_00000002"]
    assert not os.path.islink(final) and os.path.isfile(os.path.join(final, "meta.json"))
    assert (elsewhere / "old" / "meta.json").read_text() == "kept"
    assert (elsewhere / "same" / "meta.json").read_text() == "kept too"
    # a stale link is removed as a link too
    os.symlink(elsewhere / "old", root / "step_00000003.tmp")
    checkpoint.remove_stale(str(root))
    assert not os.path.lexists(root / "step_00000003.tmp") and (elsewhere / "old" / "meta.json").exists()
