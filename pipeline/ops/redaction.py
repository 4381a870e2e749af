"""Credentials never reach a message or a log: userinfo in URLs (`http://user:secret@host`) is redacted.

An S3 endpoint or a job endpoint given with embedded credentials used to be printed in error messages and
written to the run log. `redact_userinfo` replaces the `user:secret@` part of every URL in a text with
`***@`; the CLI applies it to every message it prints and, through `RedactingFilter`, to every log record.
Key material given as options or environment variables is removed by `redact`, which also applies
`redact_userinfo`.
"""
from __future__ import annotations

import logging
import os
import re
from typing import Optional


_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s'\"]+)@")


def redact_userinfo(text: str) -> str:
    return _USERINFO.sub(lambda m: m.group("scheme") + "***@", text)


class RedactingFilter(logging.Filter):
    """A logging filter (for handlers) that redacts userinfo in the formatted message of every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is logging's problem, not ours
            return True
        redacted = redact_userinfo(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def redact(text: str, secrets=None) -> str:
    """Remove credential values from a message (error texts from clients sometimes echo request details):
    `secrets`, the AWS credentials in the environment, the S3 key options Beam's client was built from, and
    userinfo in URLs."""
    values = list(secrets or [])
    values += [os.environ.get(k, "") for k in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")]
    # Imported here: the CLI imports this module before it routes logging, and importing Beam's filesystems
    # logs a warning (its optional GCP clients) that would reach the user's terminal.
    from apache_beam.io.filesystems import FileSystems  # noqa: PLC0415

    # The one read of Beam's private attribute left, on purpose (docs/DESIGN.md): a worker's options are set by
    # Beam's own worker main, not through transforms/io/filesystem_options.py, and Beam has no public getter;
    # redaction must hide whatever S3 keys Beam's client was built from. tests/unit/ops/test_redaction.py.
    opts = FileSystems._pipeline_options  # noqa: SLF001 - the options Beam's S3 client was built from
    if opts is not None:
        d = opts.get_all_options(drop_default=True)
        values += [str(d.get(k) or "") for k in ("s3_secret_access_key", "s3_session_token", "s3_access_key_id")]
    for v in values:
        if v and len(v) >= 4:  # shorter values would blank ordinary words
            text = text.replace(v, "***")
    return redact_userinfo(text)

# ------------------------------------------------------------------------------------------ at the sink
class SinkFormatter(logging.Formatter):
    """Wraps a handler's formatter: its whole output - message, traceback, exception text, whatever a library
    put in the record - is redacted and made inert (pipeline/ops/safe_text.py) as the last step before the
    handler writes it. A filter sees only the record's message: a traceback is formatted after every filter ran,
    and it carries the URL of a failing S3 call (botocore's endpoint) in clear."""

    def __init__(self, inner: Optional[logging.Formatter] = None):
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        from pipeline.ops.safe_text import log_text, terminal  # noqa: PLC0415

        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is logging's problem, not ours
            return redact_userinfo(log_text(self.inner.format(record)))
        # the message on one line (a newline in the data must not forge a log line); the traceback keeps its own
        safe = logging.makeLogRecord({**record.__dict__, "msg": terminal(message), "args": None})
        return redact_userinfo(log_text(self.inner.format(safe)))


def install_sink_formatters(logger: Optional[logging.Logger] = None) -> None:
    """Every handler of `logger` (default: the root logger) formats through a SinkFormatter (idempotent)."""
    for handler in (logger or logging.getLogger()).handlers:
        if not isinstance(handler.formatter, SinkFormatter):
            handler.setFormatter(SinkFormatter(handler.formatter))

