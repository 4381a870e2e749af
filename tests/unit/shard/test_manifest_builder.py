"""pipeline/shard/manifest_builder.py: nothing is lost, so counts that do not reconcile are never committed."""
from __future__ import annotations

import pytest

from model_contract import DataContract
from pipeline.shard import manifest_builder
from transforms.shard.records import LedgerEntry
from tests.manifest_fixtures import TOK, GEN_A, shard_config, cut_result, shard_result


def test_counts_that_do_not_reconcile_are_refused():
    contract = DataContract.for_tokens(8, TOK)
    ok = manifest_builder.build_manifest(shard_config(), contract, [LedgerEntry("a.jsonl", 10)], GEN_A, "/out",
                                         [cut_result("a.jsonl", 3, dead=1)], [], [shard_result("a.jsonl", 2)])
    assert ok.records["read"] == 3 and ok.records["written"] == 2
    with pytest.raises(manifest_builder.ReconciliationError, match=r"a.jsonl: read 4 but .* = 3"):
        manifest_builder.build_manifest(shard_config(), contract, [LedgerEntry("a.jsonl", 10)], GEN_A, "/out",
                                        [cut_result("a.jsonl", 4, dead=1)], [], [shard_result("a.jsonl", 2)])
