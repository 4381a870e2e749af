"""Credentials never reach a message or a log: userinfo in URLs (`http://user:secret@host`) is redacted.

An S3 endpoint or a job endpoint given with embedded credentials used to be printed in error messages and
written to the run log. `redact_userinfo` replaces the `user:secret@` part of every URL in a text with
`***@`; the CLI applies it to every message it prints and, through `RedactingFilter`, to every log record.
Key material given as options or environment variables is removed by `incremental.redact`.
"""
from __future__ import annotations

import logging
import re

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

