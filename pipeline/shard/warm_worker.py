"""A Beam SDK worker process started ahead of its pipeline (pipeline/shard/warm_workers.py): it imports Beam's worker
and the shard job's code, then waits for its environment on stdin and runs Beam's worker main with it. It exits
quietly when stdin closes first (the command did not need it)."""
from __future__ import annotations

import json
import os
import signal
import sys


def main() -> int:
    # A Ctrl-C in the terminal reaches the whole process group: until it is a worker, the driver answers it (and
    # kills this process, warm_workers.discard), so it prints no traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from apache_beam.runners.worker import sdk_worker_main

    import pipeline.shard.shard_pipeline  # noqa: F401 - what the job's DoFns unpickle into

    line = sys.stdin.buffer.readline()
    if not line:
        return 0
    os.environ.update(json.loads(line))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here as any worker the runner starts
    sdk_worker_main.main(sys.argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
