"""Guards of the tokenizer cache (transforms/tokenize/tokenizer_cache.py) that the issue-28 mutation check
(docs/wip/mutation-issue28.md) found untested: an entry is written atomically (under a temporary name, then
renamed), so a failed write never damages the entry that was there."""
from __future__ import annotations

from transforms.tokenize import tokenizer_cache

KEY = {"what": "test-entry", "source_sha256": "a" * 64}


class _Breaks:
    """A file object that writes the first half of what it is given, then fails (a full disk)."""

    def __init__(self, f):
        self._f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def write(self, data):
        self._f.write(data[: len(data) // 2])
        raise OSError(28, "No space left on device")


def test_a_failed_write_leaves_the_previous_entry_whole(tmp_path, monkeypatch):
    path = tokenizer_cache.entry_path(str(tmp_path), KEY)
    tokenizer_cache.write_entry(path, KEY, b"the old content")
    assert tokenizer_cache.read_entry(path, KEY) == b"the old content"
    monkeypatch.setattr(tokenizer_cache, "open", lambda p, mode="r": _Breaks(open(p, mode)), raising=False)
    tokenizer_cache.write_entry(path, KEY, b"a new content that does not fit")  # logged, not raised
    monkeypatch.undo()
    assert tokenizer_cache.read_entry(path, KEY) == b"the old content"
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.rsplit("/", 1)[1]]  # no temporary left

