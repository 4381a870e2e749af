"""pipeline/ops/lock.py: one writer per output, leases, heartbeats and stale locks."""
from __future__ import annotations

import json
import os
import socket
import time

import pytest

from pipeline.ops import lock


def _foreign_lock(out, age_s):
    out.mkdir(parents=True, exist_ok=True)
    path = out / lock.LOCK_NAME
    path.write_text(json.dumps({"host": "elsewhere", "pid": 1, "started": time.time() - age_s, "token": "t"}))
    os.utime(path, (time.time() - age_s, time.time() - age_s))
    return path


def test_a_second_lock_on_the_same_output_is_refused_naming_the_holder(tmp_path):
    first = lock.OutputLock(str(tmp_path / "out"))
    with first.held():
        with pytest.raises(lock.OutputLockedError, match=rf"output is locked by {socket.gethostname()} pid "
                                                         rf"{os.getpid()} since \d{{4}}-\d\d-\d\d"):
            lock.OutputLock(str(tmp_path / "out")).acquire()
        assert json.loads((tmp_path / "out" / lock.LOCK_NAME).read_text())["token"] == first.token
    assert not (tmp_path / "out" / lock.LOCK_NAME).exists()  # released
    with lock.OutputLock(str(tmp_path / "out")).held():  # and free again
        pass


def test_a_lock_whose_lease_ran_out_is_taken_over_and_break_lock_takes_a_live_one(tmp_path):
    out = tmp_path / "out"
    _foreign_lock(out, age_s=lock.LEASE_S + 5)
    with lock.OutputLock(str(out)).held() as mine:  # stale: taken over
        assert json.loads((out / lock.LOCK_NAME).read_text())["token"] == mine.token
    _foreign_lock(out, age_s=1)
    with pytest.raises(lock.OutputLockedError, match="locked by elsewhere pid 1"):
        lock.OutputLock(str(out)).acquire()
    with lock.OutputLock(str(out)).held(break_lock=True) as mine:
        assert json.loads((out / lock.LOCK_NAME).read_text())["token"] == mine.token
        # A second run that had also judged the old lock ("t") stale removes only that one, never ours.
        lock.OutputLock(str(out))._remove("t")
        assert json.loads((out / lock.LOCK_NAME).read_text())["token"] == mine.token


def test_the_heartbeat_renews_the_lease_and_notices_a_broken_lock(tmp_path):
    out = tmp_path / "out"
    held = lock.OutputLock(str(out), renew_s=0.05)
    held.acquire()
    try:
        path = out / lock.LOCK_NAME
        os.utime(path, (time.time() - 100, time.time() - 100))
        deadline = time.time() + 5
        while time.time() - path.stat().st_mtime > 50 and time.time() < deadline:
            time.sleep(0.02)
        assert time.time() - path.stat().st_mtime < 50  # renewed
        with lock.OutputLock(str(out)).held(break_lock=True):
            deadline = time.time() + 5
            while not held.lost and time.time() < deadline:
                time.sleep(0.02)
            assert held.lost
    finally:
        held.release()


def test_a_lock_of_a_dead_process_on_this_host_is_stale_at_once(tmp_path):
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "out"
    out.mkdir()
    (out / lock.LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid,
                                                  "started": time.time(), "token": "t"}))
    with lock.OutputLock(str(out)).held():
        pass
