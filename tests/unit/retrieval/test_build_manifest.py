"""pipeline/retrieval/build_manifest.py: reconcile refuses a database that does not account for every piece read."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.retrieval.build_manifest import ReconciliationError, reconcile

PLAN = SimpleNamespace(shard_paths=("/ds/a.tfrecord", "/ds/b.tfrecord"), config=SimpleNamespace(num_db_shards=2))
READ = [{"path": "/ds/a.tfrecord", "pieces": 10, "tokens": 700, "documents": 4},
        {"path": "/ds/b.tfrecord", "pieces": 5, "tokens": 300, "documents": 2}]
WRITTEN = [{"shard": 0, "documents": 5, "tokens": 900, "chunks": 40}, {"shard": 1, "documents": 1, "tokens": 100,
                                                                       "chunks": 4}]


def test_a_complete_database_passes():
    reconcile(PLAN, WRITTEN, READ)


@pytest.mark.parametrize("written, read, match", [
    ([{**WRITTEN[0], "documents": 4, "tokens": 850}, WRITTEN[1]], READ, "documents: read 6 .* 5 in the database"),
    ([WRITTEN[0], {**WRITTEN[1], "tokens": 99}], READ, "tokens: read 1000 .* 999 in the database"),
    (WRITTEN[:1], READ, r"database shards written \[0\]"),
    (WRITTEN + WRITTEN[1:], READ, r"database shards written \[0, 1, 1\]"),
    (WRITTEN, READ[:1], "shard files read 1"),
    (WRITTEN, READ + READ[:1], "shard files read 3"),
])
def test_a_loss_or_a_repeat_is_refused(written, read, match):
    with pytest.raises(ReconciliationError, match=match):
        reconcile(PLAN, written, read)
