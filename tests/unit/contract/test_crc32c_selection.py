"""model_contract/crc32c.py takes google_crc32c only with its C extension: its pure-Python fallback is ~100x
slower than the numpy one. Found untested by the issue-28 mutation check (docs/wip/mutation-issue28.md)."""
from __future__ import annotations

import pytest

from model_contract import crc32c


def test_google_crc32c_without_its_c_extension_is_not_selected(monkeypatch):
    google = pytest.importorskip("google_crc32c")
    monkeypatch.setattr(google, "implementation", "c", raising=False)
    assert next(iter(crc32c.implementations())) == "google_crc32c"
    monkeypatch.setattr(google, "implementation", "python", raising=False)
    found = crc32c.implementations()
    assert "google_crc32c" not in found and "pure-numpy" in found
