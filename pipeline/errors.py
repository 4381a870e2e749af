"""User errors: the one family of exceptions that the CLI turns into exit code 2 and one line on stderr.

A user error is a mistake in the command, its configuration or its inputs that the user can fix by changing
the command (a glob that matches nothing, `--seq-len 1`, an unreadable tokenizer, a manifest that is not
pileprep's). Everything else (a worker crash, a failed commit) is a failed run: exit 1 with the error.

`UserError` is the base of pileprep's own user errors. The lower layers cannot import `pipeline`
(`model_contract` is shared with the trainer and stays dependency-light; `transforms` is imported by
workers), so their user-facing exception classes are listed here by class, never matched by name:
`is_user_error` checks `isinstance` against `USER_ERRORS`. Add a class to that tuple.
"""
from __future__ import annotations

import re

from model_contract import ContractError, ContractMismatchError
from transforms.tokenize.tokenizer import TokenizerError


class UserError(ValueError):
    """A mistake the user fixes by changing the command; the message names the option or path to change."""


class ConfigError(UserError):
    """The configuration cannot work; the message says which option to change."""


class UsageError(UserError):
    """The command line itself is wrong (unknown option, missing value)."""


class RunError(RuntimeError):
    """A failed run with a known cause (exit 1, one line, no worker-log tail): it committed nothing, kept of its
    partial generation only the finished work a rerun reuses (pipeline/job.py Job.abandon), and the message says
    why (no space left, too many dead letters, a damaged dataset)."""


class RunInterrupted(BaseException):
    """SIGINT / SIGTERM: the run stopped and committed nothing, keeping only its finished
    work for a rerun (exit 130/143)."""

    def __init__(self, signum):
        # Beam re-raises a failed bundle's exception as the same type with its message augmented, so the
        # argument is either the signal number or such a message ("interrupted by signal 15 [while running..]").
        if not isinstance(signum, int):
            found = re.search(r"signal (\d+)", str(signum))
            signum = int(found.group(1)) if found else 2
        super().__init__(f"interrupted by signal {int(signum)}")
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


USER_ERRORS: tuple = (UserError, ContractError, ContractMismatchError, TokenizerError)


def is_user_error(exc: BaseException) -> bool:
    return isinstance(exc, USER_ERRORS)


def one_line(exc: BaseException) -> str:
    """The message as printed by the CLI: the first line, plus indented detail lines joined with '; '."""
    text = str(exc).strip() or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if len(lines) == 1 else lines[0].rstrip(":") + ": " + "; ".join(lines[1:])
