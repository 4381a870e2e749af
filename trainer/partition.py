"""Automatic partitioning of the GPT into pipeline stages: pure functions.

Units are the smallest movable pieces, in model order: `embed` (token + position embeddings), `block0` ...
`block{L-1}`, `head` (final LayerNorm + vocabulary head). A partition is contiguous ranges of units, one per
stage, every unit in exactly one stage — so no layer is ever dropped, whatever L and the stage count.

Cost of a unit = time_weight * (its share of the total time) + (1 - time_weight) * (its share of parameter
memory). Time comes from the FLOPs cost model or from a measured forward+backward per unit (profiled on the
first step; see `trainer.schedule.profile_unit_times`). The partition minimises the most expensive stage
exactly (dynamic programming over split points), ties broken towards the flattest partition.

Shared parameters: with tied embeddings the `embed` and `head` units share the token embedding. They sit at
the two ends of the model, so keeping them in one stage would defeat pipelining; instead the last stage holds
a copy, its memory is counted there, and the trainer all-reduces the tied gradient between the first and last
stage (a dedicated process group), which keeps the two copies identical.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from trainer.config import ModelConfig


@dataclass(frozen=True)
class Unit:
    name: str
    params: int
    flops: float  # training FLOPs per token


@dataclass(frozen=True)
class StageSpec:
    index: int
    units: tuple[str, ...]  # unit names
    first: bool
    last: bool
    layers: tuple[int, ...]  # block indices


def model_units(cfg: ModelConfig, pipelined: bool = True) -> list[Unit]:
    """The units of a GPT with their parameter counts and per-token training FLOPs."""
    d, v = cfg.d_model, cfg.vocab_size
    # Embedding lookups are memory-bound: charge one read and one gradient write per token, as FLOP-equivalents.
    units = [Unit("embed", cfg.embedding_params(), 3 * 2 * d)]
    units += [Unit(f"block{i}", cfg.block_params(), cfg.block_flops_per_token()) for i in range(cfg.n_layers)]
    head_params = 2 * d + (v * d if (pipelined or not cfg.tie_embeddings) else 0)
    units.append(Unit("head", head_params, cfg.head_flops_per_token()))
    return units


def _normalise(xs: Sequence[float]) -> list[float]:
    total = float(sum(xs))
    return [x / total if total > 0 else 1.0 / len(xs) for x in xs]


def unit_costs(units: Sequence[Unit], times: Optional[Sequence[float]] = None, time_weight: float = 0.75) -> list:
    t = _normalise(times if times is not None else [u.flops for u in units])
    m = _normalise([u.params for u in units])
    return [time_weight * ti + (1 - time_weight) * mi for ti, mi in zip(t, m)]


def balanced_splits(costs: Sequence[float], n_stages: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges, one per stage, minimising the largest stage cost (exact DP).

    Among partitions with the same (rounded) maximum, prefers the smallest sum of squared stage costs.
    """
    n = len(costs)
    if n_stages < 1:
        raise ValueError("need at least one pipeline stage")
    if n < n_stages:
        raise ValueError(f"{n} units cannot fill {n_stages} pipeline stages: lower --pp or add layers")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def seg(a, b):
        return prefix[b] - prefix[a]

    inf = (float("inf"), float("inf"))
    # best[k][i] = (max cost, sum of squares) splitting units[:i] into k stages
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = (0.0, 0.0)
    for k in range(1, n_stages + 1):
        for i in range(k, n - (n_stages - k) + 1):
            for j in range(k - 1, i):
                prev = best[k - 1][j]
                if prev == inf:
                    continue
                c = seg(j, i)
                cand = (round(max(prev[0], c), 12), prev[1] + c * c)
                if cand < best[k][i]:
                    best[k][i], cut[k][i] = cand, j
    ranges, i = [], n
    for k in range(n_stages, 0, -1):
        j = cut[k][i]
        ranges.append((j, i))
        i = j
    return ranges[::-1]


def even_splits(n_units: int, n_stages: int) -> list[tuple[int, int]]:
    """Split by unit count only (what layer-count splitters do), remainder spread over the first stages."""
    base, extra = divmod(n_units, n_stages)
    out, start = [], 0
    for s in range(n_stages):
        size = base + (1 if s < extra else 0)
        out.append((start, start + size))
        start += size
    return out


def to_stage_specs(units: Sequence[Unit], ranges: Sequence[tuple[int, int]]) -> list[StageSpec]:
    specs = []
    for s, (a, b) in enumerate(ranges):
        names = tuple(u.name for u in units[a:b])
        layers = tuple(int(n[5:]) for n in names if n.startswith("block"))
        specs.append(StageSpec(s, names, first=(a == 0), last=(b == len(units)), layers=layers))
    covered = [n for sp in specs for n in sp.units]
    if covered != [u.name for u in units]:  # defensive: never drop or duplicate a layer
        raise AssertionError(f"partition does not cover the model exactly: {covered}")
    return specs


def partition_model(cfg: ModelConfig, n_stages: int, method: str = "flops",
                    times: Optional[Sequence[float]] = None, time_weight: float = 0.75) -> list[StageSpec]:
    units = model_units(cfg, pipelined=n_stages > 1)
    if method == "even":
        ranges = even_splits(len(units), n_stages)
    elif method in ("flops", "profile"):
        if method == "profile" and times is None:
            raise ValueError("profile partitioning needs measured unit times")
        ranges = balanced_splits(unit_costs(units, times if method == "profile" else None, time_weight), n_stages)
    else:
        raise ValueError(f"unknown partition method {method!r} (--partition flops|profile|even)")
    return to_stage_specs(units, ranges)


def stage_loads(units: Sequence[Unit], specs: Sequence[StageSpec], costs: Sequence[float]) -> list[float]:
    index = {u.name: i for i, u in enumerate(units)}
    return [sum(costs[index[n]] for n in sp.units) for sp in specs]


def describe(specs: Sequence[StageSpec], units: Sequence[Unit], costs: Sequence[float]) -> str:
    loads = stage_loads(units, specs, costs)
    params = {u.name: u.params for u in units}
    parts = []
    for sp, load in zip(specs, loads):
        p = sum(params[n] for n in sp.units)
        span = f"{sp.units[0]}..{sp.units[-1]}" if len(sp.units) > 1 else sp.units[0]
        parts.append(f"stage {sp.index}: {span} ({len(sp.units)} units, {p / 1e6:.2f}M params, cost {load:.3f})")
    return "; ".join(parts)
