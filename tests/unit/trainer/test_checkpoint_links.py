"""The trainer's checkpoint directory (trainer/checkpoint.py): a save removes only what a crashed save of its own
left (`step_N.tmp`, `latest.tmp`), never a user's `*.tmp`; pruning and replacing remove a link itself, never
what it points at."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")
from trainer import checkpoint  # noqa: E402


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
