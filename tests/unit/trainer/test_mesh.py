"""trainer/mesh.py: the process group gets the configured timeout (NCCL's default would abort a Pile-scale
start while ranks index shards)."""
from __future__ import annotations

import types

import pytest


def test_process_group_gets_an_explicit_timeout(monkeypatch):
    import torch.distributed as dist
    from trainer import mesh
    seen = {}

    class Stop(Exception):
        pass

    def fake_init(**kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", fake_init)
    # a world of one, set through monkeypatch so that nothing leaks into later tests' environment
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(Stop):
        mesh.init_distributed(types.SimpleNamespace(dp=1, pp=1, tp=1, timeout_minutes=45.0), "cpu")
    assert seen["timeout"].total_seconds() == 45 * 60
