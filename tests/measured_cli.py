"""Peak RSS of a CLI run in a child process, measured so that the parent's memory cannot leak into it.

Linux keeps the high-water RSS of the mm an `execve` replaces in the process's `ru_maxrss`: a child forked from
a 3 GB pytest process reports ru_maxrss >= 3 GB whatever it used (measured: CI's `make test` saw 3031 MB for a
run whose own peak was ~640 MB, after an earlier test had grown pytest). VmHWM in /proc/self/status belongs to
the process's own mm, created by the exec, so it starts from zero. Workers the CLI starts (FnApiRunner
multi_processing) are reaped children: RUSAGE_CHILDREN holds their peaks (inherited from the CLI at most, which is
itself measured here)."""
from __future__ import annotations

CHILD_CODE = (
    "import resource, sys; from pipeline.cli import main; rc = main(sys.argv[1:]); "
    "hwm = [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]; "
    "print('PEAK_KB', max(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); sys.exit(rc)")


def peak_mb(stdout: str) -> float:
    """The child's peak RSS in MiB, from CHILD_CODE's last line (0 when the child died before printing it)."""
    return int(stdout.split("PEAK_KB")[1].split()[0]) / 1024 if "PEAK_KB" in stdout else 0.0
