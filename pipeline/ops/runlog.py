"""The structured run log: one JSON object per line, appended, flushed per event.

Events: `start` (config, runner, inputs), `plan` (generation, files to ingest, incremental diff), `progress`
(every progress tick, with all counters and rates), `nothing_to_do`, `committed` (manifest path, totals),
`summary` (final counters from Beam metrics, wall time), `error` (type and message; never credentials).
Every line carries `ts` (unix seconds), `run_id` and `event`. Local path or s3:// (written once at the end
for object stores, which cannot append).
"""
from __future__ import annotations

import json
import os
import time
import uuid
from typing import Optional

from transforms import io_utils


class RunLog:
    def __init__(self, path: Optional[str], run_id: Optional[str] = None):
        self.path = path
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self._buffer: list = []  # object stores: whole file written at close

    def event(self, event: str, **fields) -> dict:
        row = {"ts": round(time.time(), 3), "run_id": self.run_id, "event": event, **fields}
        if not self.path:
            return row
        line = json.dumps(row, sort_keys=True, default=str) + "\n"
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
    return [json.loads(line) for line in io_utils.read_bytes(path).decode("utf-8").splitlines() if line.strip()]
