"""One writer per output: an exclusive lock held for the whole run, with a lease that a heartbeat renews.

Two runs on one output used to race: the second truncated the first's committed shards and rewrote them in
place. Every shard run now takes `<output>/.pileprep.lock` before it reads the committed manifest and keeps it
until it has committed (or cleaned up after a failure):

  local / EFS / FSx   the lock file is created with O_CREAT|O_EXCL (atomic on POSIX and on NFSv4, which EFS
                      and FSx speak) and holds host, pid, start time and a random token; the heartbeat renews
                      the lease by touching it (its mtime is the lease).
  s3://               the lock object is written with a conditional PUT (`If-None-Match: *`), which S3 (and
                      moto_server) refuse when the key exists; the heartbeat re-writes the object, so its
                      LastModified is the lease, compared with the store's own clock (the response Date), not
                      the local one.

A run that crashed stops renewing: its lock is *stale* once the lease is older than `LEASE_S` (120 s; the
heartbeat renews every `RENEW_S`, 15 s) and the next run takes it over. A lock held by a dead process on this
same host is stale at once. `--break-lock` removes any lock (for an operator who knows the holder is gone).
A second run while the lock is live exits 2: "output is locked by HOST pid PID since TIME".
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Optional

from pipeline.errors import ConfigError
from transforms.io import io_utils

LOG = logging.getLogger("pileprep.lock")
LOCK_NAME = ".pileprep.lock"
LEASE_S = 120.0
RENEW_S = 15.0


class OutputLockedError(ConfigError):
    """Another run holds the output's lock (exit 2)."""


def _describe(holder: dict, age_s: Optional[float], lease_s: float) -> str:
    started = holder.get("started")
    when = (dt.datetime.fromtimestamp(started, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            if isinstance(started, (int, float)) else "an unknown time")
    renewed = f"; lease renewed {age_s:.0f}s ago, stale after {lease_s:.0f}s" if age_s is not None else ""
    return f"{holder.get('host', '?')} pid {holder.get('pid', '?')} since {when}{renewed}"


class OutputLock:
    """`with OutputLock(output).held(break_lock=False): ...` — the run's exclusive hold on `output`."""

    def __init__(self, output: str, s3_options: Optional[dict] = None, lease_s: float = LEASE_S,
                 renew_s: float = RENEW_S, remedy: str = "pass --break-lock"):
        self.output = output
        self.remedy = remedy  # what a user does when the holder is gone (the command's own option, by default)
        self.path = io_utils.join(output, LOCK_NAME)
        self.lease_s, self.renew_s = lease_s, renew_s
        self.s3_options = s3_options or {}
        self.token = uuid.uuid4().hex
        self.info = {"host": socket.gethostname(), "pid": os.getpid(), "started": round(time.time(), 3),
                     "token": self.token}
        self.lost = False  # set by the heartbeat if someone broke our lock
        self._created_output = False  # the lock made the output directory: removed again if left empty
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._local = io_utils.is_local(output)

    # --------------------------------------------------------------------------------------- public
    @contextlib.contextmanager
    def held(self, break_lock: bool = False):
        self.acquire(break_lock)
        try:
            yield self
        finally:
            self.release()

    def acquire(self, break_lock: bool = False) -> None:
        for _attempt in range(3):
            if self._try_create():
                self._start_heartbeat()
                return
            holder, age = self._read()
            if holder is None:  # released between our create and read: try again
                continue
            if break_lock:
                LOG.warning("--break-lock: removing the lock of %s on %s", _describe(holder, age, self.lease_s),
                            self.output)
            elif not self._stale(holder, age):
                raise OutputLockedError(
                    f"--output {self.output}: output is locked by {_describe(holder, age, self.lease_s)}; another "
                    f"run is writing it. Wait for it, or if it is gone {self.remedy} (a crashed run's lock "
                    f"also goes stale after {self.lease_s:.0f}s)")
            else:
                LOG.warning("taking over the stale lock of %s on %s", _describe(holder, age, self.lease_s),
                            self.output)
            self._remove(holder.get("token"))
            break_lock = False
        raise OutputLockedError(f"--output {self.output}: could not take the lock {self.path} (contended)")

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        holder, _age = self._read()
        if holder is not None and holder.get("token") == self.token:
            self._remove(self.token)
        if self._created_output:  # a run that failed its checks leaves no empty output directory behind
            with contextlib.suppress(OSError):
                os.rmdir(self.output)

    def renew(self) -> bool:
        """Renew the lease; False (and `lost`) if the lock is no longer ours."""
        holder, _age = self._read()
        if holder is None or holder.get("token") != self.token:
            self.lost = True
            return False
        if self._local:
            os.utime(self.path)
        else:
            self._s3_put(conditional=False)
        return True

    # ------------------------------------------------------------------------------------- internals
    def _stale(self, holder: dict, age: Optional[float]) -> bool:
        if age is not None and age > self.lease_s:
            return True
        if self._local and holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
            try:
                os.kill(holder["pid"], 0)
            except ProcessLookupError:
                return True  # the holder died on this very host
            except PermissionError:
                pass
        return False

    def _start_heartbeat(self) -> None:
        def beat():
            while not self._stop.wait(self.renew_s):
                try:
                    if not self.renew():
                        LOG.error("the lock on %s was broken by another run (--break-lock?)", self.output)
                        return
                except Exception as e:  # noqa: BLE001 - a missed renewal is retried at the next beat
                    LOG.warning("could not renew the lock on %s: %s", self.output, type(e).__name__)

        self._thread = threading.Thread(target=beat, name="pileprep-lock-heartbeat", daemon=True)
        self._thread.start()

    def _body(self) -> bytes:
        return (json.dumps(self.info, sort_keys=True) + "\n").encode("utf-8")

    def _try_create(self) -> bool:
        if not self._local:
            return self._s3_put(conditional=True)
        if not os.path.isdir(self.output):
            os.makedirs(self.output, exist_ok=True)
            self._created_output = True
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(self._body())
            f.flush()
            os.fsync(f.fileno())
        return True

    def _read(self):
        """(holder dict, lease age in seconds) or (None, None) when there is no lock."""
        if not self._local:
            return self._s3_read()
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
            age = time.time() - os.stat(self.path).st_mtime
        except FileNotFoundError:
            return None, None
        try:
            holder = json.loads(raw.decode("utf-8"))
        except ValueError:  # written by a run killed between create and write: judge by age alone
            holder = {}
        return (holder if isinstance(holder, dict) else {}), age

    def _remove(self, token: Optional[str]) -> None:
        """Remove the lock if it still holds `token` (None: whatever it holds). Of two runs that both found a
        lock stale, the second then sees the first one's new token and leaves it: it loses the O_EXCL create
        (or conditional PUT) that follows and reports the lock as held."""
        if token is not None:
            holder, _age = self._read()
            if holder is None or holder.get("token") != token:
                return
        if self._local:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            return
        bucket, key = self._bucket_key()
        self._client().delete_object(Bucket=bucket, Key=key)

    # ------------------------------------------------------------------------------------------- S3
    def _bucket_key(self):
        rest = self.path.split("://", 1)[1]
        bucket, _, key = rest.partition("/")
        return bucket, key

    def _client(self):
        if not hasattr(self, "_s3"):
            self._s3 = io_utils.s3_client(self.s3_options)[1]
        return self._s3

    def _s3_put(self, conditional: bool) -> bool:
        from botocore.exceptions import ClientError  # noqa: PLC0415

        bucket, key = self._bucket_key()
        kwargs = {"IfNoneMatch": "*"} if conditional else {}
        try:
            self._client().put_object(Bucket=bucket, Key=key, Body=self._body(), **kwargs)
        except ClientError as e:
            code = str(e.response.get("Error", {}).get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if conditional and (code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)):
                return False
            raise
        return True

    def _s3_read(self):
        from botocore.exceptions import ClientError  # noqa: PLC0415

        bucket, key = self._bucket_key()
        try:
            resp = self._client().get_object(Bucket=bucket, Key=key)
        except ClientError as e:
            if str(e.response.get("Error", {}).get("Code", "")) in ("NoSuchKey", "404", "NotFound"):
                return None, None
            raise
        raw = resp["Body"].read()
        age = None
        server_now = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        if server_now and resp.get("LastModified"):
            from email.utils import parsedate_to_datetime  # noqa: PLC0415

            age = (parsedate_to_datetime(server_now) - resp["LastModified"]).total_seconds()
        try:
            holder = json.loads(raw.decode("utf-8"))
        except ValueError:
            holder = {}
        return (holder if isinstance(holder, dict) else {}), age
