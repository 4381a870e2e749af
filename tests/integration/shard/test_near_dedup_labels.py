"""The near-dedup graph's label propagation (pipeline/shard/near_dedup/labels.py propagate_labels) run by Beam on
a small graph: one keeper per cluster, the removals and cluster sizes that the one-process reference
(transforms/shard/near_dedup/clusters.py components) gives, and a run that fails when the rounds are too few."""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from pipeline.shard.near_dedup.elements import ClusterMember, Removal
from pipeline.shard.near_dedup.labels import propagate_labels
from transforms.shard.near_dedup import clusters, minhash, shingling

TEXT = " ".join(f"word{i % 97} token{i % 13} item{i}" for i in range(120))


def _node(doc_id: int, split: int = 0) -> clusters.Node:
    sig = minhash.signatures([shingling.shingles(TEXT)], minhash.MinHashParams())[0]
    return clusters.Node(clusters.rank(split, doc_id), doc_id, split, sig.tobytes(), f"src{doc_id}",
                         (f"unit-{doc_id % 3}", doc_id))


def _edges() -> list:
    chain = [_node(i) for i in range(10, 15)]  # 10-11-12-13-14: keeper 10, four rounds away
    held_out = _node(40, split=1)  # a val document outranks a train one with a smaller id
    return ([clusters.Edge(chain[i], chain[i + 1], 0.9) for i in range(4)]
            + [clusters.Edge(held_out, _node(30), 0.95), clusters.Edge(_node(30), _node(50), 0.85)])


def _ids(element) -> tuple:
    if isinstance(element, Removal):
        return ("removed", element.doc_id, element.row["keeper"], element.row["reason"])
    return ("member of", element.keeper_id)


def test_labels_reach_the_keeper_of_each_cluster_as_the_reference_does():
    reference, converged = clusters.components(_edges(), rounds=6)
    assert converged
    want = [("member of", keeper.doc_id) for _node_, keeper in reference.values()]
    want += [("removed", d, keeper.doc_id, "near_duplicate") for d, (_n, keeper) in reference.items()
             if keeper.doc_id != d]
    assert sorted(w[1] for w in want if w[0] == "removed") == [11, 12, 13, 14, 30, 50]
    with BeamTestPipeline() as p:
        final = propagate_labels(p | beam.Create(_edges()), rounds=6)
        assert_that(final | beam.Map(_ids), equal_to(want))


def test_too_few_rounds_fail_the_run_naming_the_option():
    with pytest.raises(Exception, match="did not converge within --near-dedup-rounds 2"):
        with BeamTestPipeline() as p:
            final = propagate_labels(p | beam.Create(_edges()), rounds=2)
            assert_that(final | beam.Map(_ids), equal_to([]))


def test_the_removal_row_names_both_documents():
    with BeamTestPipeline() as p:
        final = propagate_labels(p | beam.Create([clusters.Edge(_node(7), _node(9), 0.9)]), rounds=3)
        rows = final | "Removals" >> beam.Filter(isinstance, Removal) | "Rows" >> beam.Map(lambda e: e.row)
        assert_that(rows, equal_to([{"id": 9, "reason": "near_duplicate", "keeper": 7, "jaccard": 1.0,
                                     "source": "src9", "keeper_source": "src7", "loc": ["unit-0", 9],
                                     "keeper_loc": ["unit-1", 7]}]))
        members = (final | "Members" >> beam.Filter(isinstance, ClusterMember)
                   | "Keepers" >> beam.Map(lambda e: e.keeper_id))
        assert_that(members, equal_to([7, 7]), label="members")
