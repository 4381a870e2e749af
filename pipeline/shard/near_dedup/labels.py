"""Connected components of the near-dedup graph by label propagation, unrolled into the graph: each round
every node takes the best label (transforms/shard/near_dedup/clusters.py `best_label`: the keeper rule) among
its own and its neighbours', one GroupByKey per round, so no process holds more than one node's neighbours. A
node whose label still changed in the last round fails the run (raise --near-dedup-rounds). clusters.components
is the same algorithm in one process, the reference the tests compare with."""
from __future__ import annotations

import apache_beam as beam

from pipeline.errors import RunError
from pipeline.shard.near_dedup.elements import ClusterMember, LabelOffer, NodeState, Removal
from transforms.shard.near_dedup import clusters, removals


def adjacency(edge: clusters.Edge):
    """Both ends of an edge, each keyed by its id with the other's id."""
    yield edge.a.doc_id, (edge.a, edge.b.doc_id)
    yield edge.b.doc_id, (edge.b, edge.a.doc_id)


def initial_state(kv) -> tuple:
    """(doc_id, NodeState) of a node and its neighbours' ids: the label starts as the node itself."""
    doc_id, pairs = kv
    pairs = list(pairs)
    node = min(p[0] for p in pairs)  # copies of one Node: identical, min only makes the choice explicit
    return doc_id, NodeState(node, tuple(sorted({p[1] for p in pairs})), node, True)


def messages(kv):
    """A node's state to itself and its label to each neighbour, for the next round."""
    doc_id, state = kv
    yield doc_id, state
    for m in state.neighbours:
        yield m, LabelOffer(state.label)


def relabel(kv) -> tuple:
    """(doc_id, NodeState) after one round: the best of its label and the labels offered to it."""
    doc_id, msgs = kv
    state, labels = None, []
    for msg in msgs:
        if isinstance(msg, NodeState):
            state = msg
        else:
            labels.append(msg.label)
    new = clusters.best_label([state.label] + labels)
    return doc_id, NodeState(state.node, state.neighbours, new, new != state.label)


def final_rows(kv, rounds: int):
    """A node's ClusterMember, and its Removal when its cluster's keeper is another document."""
    _doc_id, state = kv
    node, keeper = state.node, state.label
    if state.changed:
        raise RunError(f"near-dedup clusters did not converge within --near-dedup-rounds {rounds} (a cluster "
                       "holds documents farther apart than that); raise --near-dedup-rounds")
    yield ClusterMember(keeper.doc_id)
    removal = None if node.committed else clusters.removal_of(node, keeper)  # committed files are immutable
    if removal is not None:
        removed, keeper_id, j = removal
        row = {"id": removed, "reason": removals.NEAR_DUPLICATE, "keeper": keeper_id, "jaccard": j,
               "source": node.source, "keeper_source": keeper.source, "loc": list(node.loc[:2]),
               "keeper_loc": list(keeper.loc[:2])}
        if keeper.committed:
            row.update(reason=removals.NEAR_DUPLICATE_OF_COMMITTED, keeper_generation=keeper.loc[1], keeper_loc=[])
        yield Removal(removed, row)


def propagate_labels(edges, rounds: int):
    """Edges -> a ClusterMember per node and a Removal per node that is not its cluster's keeper. Steps of the
    NearDedup transform, labelled as in it (they are not a composite of their own, so the labels stay put)."""
    state = (edges
             | "NDAdjacency" >> beam.FlatMap(adjacency)
             | "NDGroupAdjacency" >> beam.GroupByKey()
             | "NDInitial" >> beam.Map(initial_state))
    for r in range(rounds):
        state = (state
                 | f"NDMessages{r}" >> beam.FlatMap(messages)
                 | f"NDGroupMessages{r}" >> beam.GroupByKey()
                 | f"NDRelabel{r}" >> beam.Map(relabel))
    return state | "NDFinal" >> beam.FlatMap(final_rows, rounds)
