"""Credentials never reach a message or a log: userinfo in URLs (`http://user:secret@host`) is redacted.

An S3 endpoint or a job endpoint given with embedded credentials used to be printed in error messages and
written to the run log. `redact_userinfo` replaces the `user:secret@` part of every URL in a text with
`***@`; the CLI applies it to every message it prints and, through `RedactingFilter`, to every log record.
Key material given as options or environment variables is removed by `incremental.redact`.
"""
from __future__ import annotations

import logging
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

