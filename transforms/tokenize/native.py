"""Panics of the tokenizers' Rust code, told apart from everything else.

pyo3 turns a Rust panic into `pyo3_runtime.PanicException`, which derives from BaseException, not Exception: an
`except Exception` misses it and the run ends in a long traceback with exit 1. HF `tokenizers`, tiktoken and
gigatoken each ship their own copy of that class, so it is recognised by name and module, never by catching
BaseException wholesale (KeyboardInterrupt, SystemExit and the job's own BaseExceptions, such as
pipeline/errors.py's RunInterrupted, must pass through).
"""
from __future__ import annotations

import contextlib

from transforms.tokenize import formats

TOKENIZER_PANIC = "tokenizer_panic"  # the dead-letter reason of a document the tokenizer's library panicked on


def is_panic(exc: BaseException) -> bool:
    """Whether `exc` is a Rust panic surfaced by pyo3 (any extension module's copy of PanicException)."""
    return any(cls.__name__ == "PanicException" and cls.__module__ == "pyo3_runtime" for cls in type(exc).__mro__)


def describe(exc: BaseException) -> str:
    """The panic's message on one line, short enough for a dead letter or a usage error."""
    return " ".join(str(exc).split())[:200] or type(exc).__name__


@contextlib.contextmanager
def load_guard(what: str):
    """Turn a panic while loading into the FormatError naming `what` (exit 2, one line)."""
    try:
        yield
    except BaseException as e:
        if not is_panic(e):
            raise
        raise formats.FormatError(f"{what} panicked loading this file: {describe(e)}") from None
