"""The structured run log: one JSON object per line, appended, flushed per event.

Events: `start` (config, runner, inputs), `plan` (generation, files to ingest, incremental diff), `progress`
(every progress tick, with all counters and rates), `nothing_to_do`, `committed` (manifest path, totals),
`summary` (final counters from Beam metrics, wall time), `error` (type and message; never credentials).
Every line carries `ts` (unix seconds), `run_id` and `event`. Local path or s3:// (written once at the end
for object stores, which cannot append).

`WorkerLog` is the other log: the unstructured stderr of Beam and its local workers, kept out of the user's
terminal and shown (its tail) only when the run fails.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import traceback
import uuid
from typing import Optional

from pipeline.ops.redaction import redact_userinfo
from pipeline.ops.safe_text import terminal
from transforms.io import io_utils


class RunLog:
    def __init__(self, path: Optional[str], run_id: Optional[str] = None):
        self.path = path
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self._buffer: list = []  # object stores: whole file written at close

    def event(self, event: str, **fields) -> dict:
        row = {"ts": round(time.time(), 3), "run_id": self.run_id, "event": event, **fields}
        if not self.path:
            return row
        # At the sink: whatever a field holds (an error message, a traceback, an option), no credentials.
        line = redact_userinfo(json.dumps(row, sort_keys=True, default=str)) + "\n"
        if io_utils.is_local(self.path):
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
        else:
            self._buffer.append(line)
        return row

    def close(self) -> None:
        if self.path and not io_utils.is_local(self.path) and self._buffer:
            io_utils.write_bytes(self.path, "".join(self._buffer).encode("utf-8"))
            self._buffer = []


def read_run_log(path: str) -> list:
    """The events of a `--run-log` file (local or s3://), in order: public API for an operator's script that reads
    how a run went (its `committed` or `error` event, `summary` counters; docs/OPERATIONS.md "Run log"), e.g. an
    Airflow task after the shard task of pipeline/ops/schedule/airflow_dag.py. pileprep itself only writes it."""
    return [json.loads(line) for line in io_utils.read_bytes(path).decode("utf-8").splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------ worker logs
class WorkerLog:
    """Sends everything written to file descriptor 2 — Beam's driver and local worker processes, which inherit
    it — to a log file while the job runs, and keeps `stderr`, a handle on the real stderr, for progress and
    the pileprep messages the user should see.

    The file starts in the system temp directory (the output may not exist yet, and a mistyped `--output` must
    not be created by a logger). On failure the CLI moves it to `<staging root>/logs/` (`keep`) when the
    staging root is a local directory that the run created, and prints its tail; on success it is deleted (the
    JSON-lines run log is the record of a run). Without a real stderr file descriptor (an embedding test
    harness), nothing is redirected and `stderr` is sys.stderr.
    """

    TAIL_LINES = 20

    def __init__(self, staging_root: Optional[str]):
        self.staging_root = staging_root
        self.path: Optional[str] = None
        self.stderr = None
        self.last_lines: list = []
        self._saved_fd: Optional[int] = None

    def __enter__(self) -> "WorkerLog":
        try:
            fd2 = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):
            fd2 = None
        if fd2 != 2:
            self.stderr = sys.stderr
            return self
        sys.stderr.flush()
        fd, self.path = tempfile.mkstemp(prefix=f"pileprep-{time.strftime('%Y%m%dT%H%M%S')}-", suffix=".log")
        self._saved_fd = os.dup(2)
        self.stderr = os.fdopen(os.dup(self._saved_fd), "w", buffering=1, encoding="utf-8", errors="replace")
        os.dup2(fd, 2)
        os.close(fd)
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and self.path:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            self.last_lines = self.tail()  # what the workers said, before the traceback is added below
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(redact_userinfo("".join(traceback.format_exception(exc_type, exc, tb))))
        if self._saved_fd is not None:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
            os.dup2(self._saved_fd, 2)
            os.close(self._saved_fd)
            self._saved_fd = None
            try:
                self.stderr.close()
            except OSError:
                pass
        self.stderr = sys.stderr
        if exc is None and self.path:
            try:
                os.remove(self.path)
            except OSError:
                pass
            self.path = None
        return False

    def tail(self, n: int = TAIL_LINES) -> list:
        """The last `n` non-empty lines of the log, redacted and inert: the CLI prints them on the terminal."""
        if not self.path or not os.path.exists(self.path):
            return []
        with open(self.path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            lines = f.read().decode("utf-8", "replace").splitlines()
        return [terminal(redact_userinfo(ln)) for ln in lines if ln.strip()][-n:]

    def discard(self) -> None:
        """Remove the log (a user error: the one-line message says everything)."""
        if self.path:
            try:
                os.remove(self.path)
            except OSError:
                pass
            self.path = None

    def keep(self) -> Optional[str]:
        """Move the log next to the run's staging files when there are any; its final path. The kept file is
        redacted first: Beam's workers write to it directly (fd 2), past every logging handler of ours."""
        if not self.path:
            return None
        redact_file(self.path)
        root = self.staging_root
        if root and io_utils.is_local(root) and os.path.isdir(root):
            dest_dir = os.path.join(root, "logs")
            try:
                os.makedirs(dest_dir, exist_ok=True)
                dest = os.path.join(dest_dir, os.path.basename(self.path))
                shutil.move(self.path, dest)
                self.path = dest
            except OSError:
                pass
        return self.path


def redact_file(path: str) -> None:
    """Rewrite a local text file with credentials in URLs redacted (temp name + rename), line by line."""
    tmp = f"{path}.{os.getpid()}.redacting"
    try:
        with open(path, encoding="utf-8", errors="replace") as src, open(tmp, "w", encoding="utf-8") as dst:
            for line in src:
                dst.write(redact_userinfo(line))
        os.replace(tmp, path)
    except OSError:
        try:
            os.remove(tmp)
        except OSError:
            pass
